"""Kandinsky 6 weights on disk, declared for the generic adapter (:class:`~nemo_vfm.models.common.weights.
WeightsAdapter`): :data:`ADAPTER`.

Our names are diffusers' ``Kandinsky6Transformer3DModel`` names except where our tree is flatter: :data:`RENAMES`
maps ours to diffusers' and :data:`INVERSE` back; every other name must start with one of :data:`SAME` (a name that
matches no rule raises, naming it). Folders: a transformer folder (``config.json`` +
``diffusion_pytorch_model*.safetensors``) or a pipeline folder whose ``transformer/`` holds it. Only the diffusers
layout is known (the release's own checkpoint names are not declared here: ``layouts=("diffusers",)``).
"""

from __future__ import annotations

from nemo_vfm.models.common.weights import WeightsAdapter

SAME = ("visual_embeddings", "visual_token_type_embeddings", "out_layer", "audio_embeddings", "audio_out_layer",
        "video_text_embeddings", "audio_text_embeddings", "video_pooled_text_embeddings",
        "audio_pooled_text_embeddings")
_SAME = r"^(" + "|".join(SAME) + r")\."

RENAMES: tuple[tuple[str, str], ...] = (
    (r"^blocks\.(\d+)\.video\.", r"visual_transformer_blocks.\1.video_dec_block."),
    (r"^blocks\.(\d+)\.audio\.", r"visual_transformer_blocks.\1.audio_dec_block."),
    (r"^blocks\.(\d+)\.(va_|av_)", r"visual_transformer_blocks.\1.\2"),
    (r"^(video|audio)_text_blocks\.", r"\1_text_transformer_blocks."),
    (r"^(video|audio)_time_embeddings\.linear_", r"\1_time_embeddings.timestep_embedder.linear_"),
    (r"\.feed_forward\.in_layer\.", ".feed_forward.net.0.proj."),
    (r"\.feed_forward\.out_layer\.", ".feed_forward.net.2."),
    (_SAME, r"\1."),
)
INVERSE: tuple[tuple[str, str], ...] = (
    (r"^visual_transformer_blocks\.(\d+)\.video_dec_block\.", r"blocks.\1.video."),
    (r"^visual_transformer_blocks\.(\d+)\.audio_dec_block\.", r"blocks.\1.audio."),
    (r"^visual_transformer_blocks\.(\d+)\.(va_|av_)", r"blocks.\1.\2"),
    (r"^(video|audio)_text_transformer_blocks\.", r"\1_text_blocks."),
    (r"^(video|audio)_time_embeddings\.timestep_embedder\.linear_", r"\1_time_embeddings.linear_"),
    (r"\.feed_forward\.net\.0\.proj\.", ".feed_forward.in_layer."),
    (r"\.feed_forward\.net\.2\.", ".feed_forward.out_layer."),
    (_SAME, r"\1."),
)

ADAPTER = WeightsAdapter(
    family="Kandinsky6", diffusers_class="Kandinsky6Transformer3DModel", to_diffusers=RENAMES, from_diffusers=INVERSE,
    complete=True, diffusers_keys=r"^visual_transformer_blocks\.", original_keys=r"^blocks\.\d+\.video\.",
    layouts=("diffusers",),
    folder_hint="a Kandinsky 6 transformer folder (diffusers layout) or a Kandinsky 6 pipeline folder with transformer/",
    config_hint="flavor: layers, widths, audio widths, token types")
load_weights = ADAPTER.load_weights
