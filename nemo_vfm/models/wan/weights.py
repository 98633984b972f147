"""Wan 2.1 / 2.2 weights on disk, declared for the generic adapter (:class:`~nemo_vfm.models.common.weights.
WeightsAdapter`): :data:`ADAPTER`.

Parameter names: ours are the original release's; :data:`RENAMES` maps them to diffusers'
``WanTransformer3DModel`` names and :data:`INVERSE` back. Folders: a transformer folder in either layout (``config.json`` +
``diffusion_pytorch_model*.safetensors``, with the ``.index.json`` when sharded) or a pipeline folder whose
``transformer/`` holds it. A Wan 2.2 A14B folder holds two experts (:data:`EXPERT_DIRS`): a diffusers pipeline's
``transformer/`` (high noise) and ``transformer_2/`` (low noise), or the release's ``high_noise_model/`` and
``low_noise_model/``; ``expert="high"|"low"`` picks one. Configs live in ``convert.py``; this module needs no model class, so
``model.py`` can load pretrained weights through it.
"""

from __future__ import annotations

from nemo_vfm.models.common.weights import WeightsAdapter

# original (= ours) -> diffusers name pieces, applied in order to dotted names
RENAMES: tuple[tuple[str, str], ...] = (
    (r"^time_embedding\.0\.", "condition_embedder.time_embedder.linear_1."),
    (r"^time_embedding\.2\.", "condition_embedder.time_embedder.linear_2."),
    (r"^text_embedding\.0\.", "condition_embedder.text_embedder.linear_1."),
    (r"^text_embedding\.2\.", "condition_embedder.text_embedder.linear_2."),
    (r"^time_projection\.1\.", "condition_embedder.time_proj."),
    (r"^img_emb\.proj\.0\.", "condition_embedder.image_embedder.norm1."),
    (r"^img_emb\.proj\.1\.", "condition_embedder.image_embedder.ff.net.0.proj."),
    (r"^img_emb\.proj\.3\.", "condition_embedder.image_embedder.ff.net.2."),
    (r"^img_emb\.proj\.4\.", "condition_embedder.image_embedder.norm2."),
    (r"^head\.modulation$", "scale_shift_table"),
    (r"^head\.head\.", "proj_out."),
    (r"\.modulation$", ".scale_shift_table"),
    (r"\.ffn\.0\.", ".ffn.net.0.proj."),
    (r"\.ffn\.2\.", ".ffn.net.2."),
    (r"\.norm3\.", ".norm2."),  # the cross-attention norm: norm3 in Wan, norm2 in diffusers
    (r"\.self_attn\.o\.", ".attn1.to_out.0."),
    (r"\.self_attn\.(q|k|v)\.", r".attn1.to_\1."),
    (r"\.self_attn\.norm_(q|k)\.", r".attn1.norm_\1."),
    (r"\.cross_attn\.o\.", ".attn2.to_out.0."),
    (r"\.cross_attn\.(q|k|v)\.", r".attn2.to_\1."),
    (r"\.cross_attn\.(k|v)_img\.", r".attn2.add_\1_proj."),
    (r"\.cross_attn\.norm_(q|k)\.", r".attn2.norm_\1."),
    (r"\.cross_attn\.norm_k_img\.", ".attn2.norm_added_k."),
)
INVERSE: tuple[tuple[str, str], ...] = (
    (r"^condition_embedder\.time_embedder\.linear_1\.", "time_embedding.0."),
    (r"^condition_embedder\.time_embedder\.linear_2\.", "time_embedding.2."),
    (r"^condition_embedder\.text_embedder\.linear_1\.", "text_embedding.0."),
    (r"^condition_embedder\.text_embedder\.linear_2\.", "text_embedding.2."),
    (r"^condition_embedder\.time_proj\.", "time_projection.1."),
    (r"^condition_embedder\.image_embedder\.norm1\.", "img_emb.proj.0."),
    (r"^condition_embedder\.image_embedder\.ff\.net\.0\.proj\.", "img_emb.proj.1."),
    (r"^condition_embedder\.image_embedder\.ff\.net\.2\.", "img_emb.proj.3."),
    (r"^condition_embedder\.image_embedder\.norm2\.", "img_emb.proj.4."),
    (r"^scale_shift_table$", "head.modulation"),
    (r"^proj_out\.", "head.head."),
    (r"\.scale_shift_table$", ".modulation"),
    (r"\.ffn\.net\.0\.proj\.", ".ffn.0."),
    (r"\.ffn\.net\.2\.", ".ffn.2."),
    (r"\.norm2\.", ".norm3."),
    (r"\.attn1\.to_out\.0\.", ".self_attn.o."),
    (r"\.attn1\.to_(q|k|v)\.", r".self_attn.\1."),
    (r"\.attn1\.norm_(q|k)\.", r".self_attn.norm_\1."),
    (r"\.attn2\.to_out\.0\.", ".cross_attn.o."),
    (r"\.attn2\.to_(q|k|v)\.", r".cross_attn.\1."),
    (r"\.attn2\.add_(k|v)_proj\.", r".cross_attn.\1_img."),
    (r"\.attn2\.norm_(q|k)\.", r".cross_attn.norm_\1."),
    (r"\.attn2\.norm_added_k\.", ".cross_attn.norm_k_img."),
)


EXPERT_DIRS: dict[str, tuple[str, str]] = {"high": ("transformer", "high_noise_model"),
                                            "low": ("transformer_2", "low_noise_model")}  # (diffusers, original)

ADAPTER = WeightsAdapter(
    family="Wan", diffusers_class="WanTransformer3DModel", original_classes=("WanModel",),
    original_config_keys=("dim", "num_heads", "in_dim"), to_diffusers=RENAMES, from_diffusers=INVERSE,
    diffusers_keys=r"^condition_embedder\.|\.attn1\.", original_keys=r"^time_embedding\.|\.self_attn\.",
    unloaded=r"\.norm_added_q\.",  # diffusers' model ignores it on load; the release does not have it
    experts=EXPERT_DIRS, experts_what="two Wan 2.2 experts", folder_hint="a Wan transformer folder (diffusers or original layout) or a Wan pipeline "
                                     "folder with transformer/",
    config_hint="flavor: layers, sizes; T2V vs I2V")
load_weights = ADAPTER.load_weights
