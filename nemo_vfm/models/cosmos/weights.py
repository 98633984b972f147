"""Cosmos-Predict2.5 weights on disk, declared for the generic adapter (:class:`~nemo_vfm.models.common.weights.
WeightsAdapter`): :data:`ADAPTER`.

Ours are the original release's names without its ``net.`` prefix (the release's non-parameter entries, sample
counters, RoPE buffers and ``_extra_state``, are dropped); :data:`RENAMES` maps them to diffusers'
``CosmosTransformer3DModel`` names and :data:`INVERSE` back. A folder is a transformer folder (``config.json`` +
``diffusion_pytorch_model*.safetensors``, with the ``.index.json`` when sharded) or a pipeline folder whose
``transformer/`` holds it.
"""

from __future__ import annotations

from nemo_vfm.models.common.weights import WeightsAdapter

__all__ = ["ADAPTER", "RENAMES", "INVERSE", "load_weights"]

_ADALN = {"self_attn": "norm1", "cross_attn": "norm2", "mlp": "norm3"}
_PROJ = {"q_proj": "to_q", "k_proj": "to_k", "v_proj": "to_v", "output_proj": "to_out.0", "q_norm": "norm_q",
         "k_norm": "norm_k"}

# ours -> diffusers, applied in order to dotted names
RENAMES: tuple[tuple[str, str], ...] = (
    (r"^x_embedder\.proj\.1\.", "patch_embed.proj."),
    (r"^t_embedder\.1\.", "time_embed.t_embedder."),
    (r"^t_embedding_norm\.", "time_embed.norm."),
    (r"^final_layer\.adaln_modulation\.(1|2)\.", lambda m: f"norm_out.linear_{m[1]}."),
    (r"^final_layer\.linear\.", "proj_out."),
    (r"^blocks\.", "transformer_blocks."),
    (r"\.adaln_modulation_(self_attn|cross_attn|mlp)\.(1|2)\.", lambda m: f".{_ADALN[m[1]]}.linear_{m[2]}."),
    (r"\.self_attn\.", ".attn1."),
    (r"\.cross_attn\.", ".attn2."),
    (r"\.(q_proj|k_proj|v_proj|output_proj|q_norm|k_norm)\.", lambda m: f".{_PROJ[m[1]]}."),
    (r"\.mlp\.layer1\.", ".ff.net.0.proj."),
    (r"\.mlp\.layer2\.", ".ff.net.2."),
)
_UNADALN = {v: k for k, v in _ADALN.items()}
_UNPROJ = {v: k for k, v in _PROJ.items()}
INVERSE: tuple[tuple[str, str], ...] = (
    (r"^patch_embed\.proj\.", "x_embedder.proj.1."),
    (r"^time_embed\.t_embedder\.", "t_embedder.1."),
    (r"^time_embed\.norm\.", "t_embedding_norm."),
    (r"^norm_out\.linear_(1|2)\.", lambda m: f"final_layer.adaln_modulation.{m[1]}."),
    (r"^proj_out\.", "final_layer.linear."),
    (r"^transformer_blocks\.", "blocks."),
    (r"\.(norm1|norm2|norm3)\.linear_(1|2)\.", lambda m: f".adaln_modulation_{_UNADALN[m[1]]}.{m[2]}."),
    (r"\.attn1\.", ".self_attn."),
    (r"\.attn2\.", ".cross_attn."),
    (r"\.(to_q|to_k|to_v|to_out\.0|norm_q|norm_k)\.", lambda m: f".{_UNPROJ[m[1]]}."),
    (r"\.ff\.net\.0\.proj\.", ".mlp.layer1."),
    (r"\.ff\.net\.2\.", ".mlp.layer2."),
)


ADAPTER = WeightsAdapter(
    family="Cosmos", diffusers_class="CosmosTransformer3DModel", to_diffusers=RENAMES, from_diffusers=INVERSE,
    diffusers_keys=r"^(transformer_blocks|patch_embed)\.", original_keys=r"^(net\.)?(blocks|x_embedder)\.",
    original_prefix="net.", original_extras=("accum_video_sample_counter", "accum_image_sample_counter",
                                             "accum_iteration", "accum_train_in_hours", "pos_embedder.", "_extra_state"),
    layouts=("diffusers",),  # the release ships .pt files with its own configs, which we do not write
    folder_hint="a Cosmos transformer folder or a Cosmos-Predict2.5 pipeline folder with transformer/",
    config_hint="flavor: layers, sizes")
load_weights = ADAPTER.load_weights
