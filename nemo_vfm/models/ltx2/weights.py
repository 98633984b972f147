"""LTX-2 weights on disk, declared for the generic adapter (:class:`~nemo_vfm.models.common.weights.WeightsAdapter`):
:data:`ADAPTER`.

Parameter names: ours are the release's (``ltx-2-19b-*.safetensors``, under ``model.diffusion_model.``);
:data:`RENAMES` maps them to diffusers' ``LTX2VideoTransformer3DModel`` and :data:`INVERSE` back. The mapping is
diffusers' own single-file converter (``diffusers.loaders.single_file_utils.convert_ltx2_transformer_to_diffusers``):
``patchify_proj`` -> ``proj_in``, ``adaln_single`` -> ``time_embed``, ``av_ca_*_adaln_single`` ->
``av_cross_attn_*``, ``scale_shift_table_a2v_ca_*`` -> ``*_a2v_cross_attn_scale_shift_table``, ``q_norm`` ->
``norm_q``; every other name is shared. The release file also holds the text connectors
(``*_embeddings_connector``), the VAEs, the vocoder and the text projection: loading skips them (they are not the
transformer's).
"""

from __future__ import annotations

from nemo_vfm.models.common.weights import WeightsAdapter

_TOP = ("patchify_proj", "proj_in"), ("audio_patchify_proj", "audio_proj_in"), ("adaln_single", "time_embed"), \
    ("audio_adaln_single", "audio_time_embed"), \
    ("av_ca_video_scale_shift_adaln_single", "av_cross_attn_video_scale_shift"), \
    ("av_ca_a2v_gate_adaln_single", "av_cross_attn_video_a2v_gate"), \
    ("av_ca_audio_scale_shift_adaln_single", "av_cross_attn_audio_scale_shift"), \
    ("av_ca_v2a_gate_adaln_single", "av_cross_attn_audio_v2a_gate")
_BLOCK = ((r"\.scale_shift_table_a2v_ca_video$", ".video_a2v_cross_attn_scale_shift_table"),
          (r"\.scale_shift_table_a2v_ca_audio$", ".audio_a2v_cross_attn_scale_shift_table"),
          (r"\.q_norm\.", ".norm_q."), (r"\.k_norm\.", ".norm_k."))
_BLOCK_INV = ((r"\.video_a2v_cross_attn_scale_shift_table$", ".scale_shift_table_a2v_ca_video"),
              (r"\.audio_a2v_cross_attn_scale_shift_table$", ".scale_shift_table_a2v_ca_audio"),
              (r"\.norm_q\.", ".q_norm."), (r"\.norm_k\.", ".k_norm."))
RENAMES: tuple[tuple[str, str], ...] = tuple((rf"^{o}\.", f"{d}.") for o, d in _TOP) + _BLOCK
INVERSE: tuple[tuple[str, str], ...] = tuple((rf"^{d}\.", f"{o}.") for o, d in _TOP) + _BLOCK_INV

# our top-level modules and parameters; anything else in a release file (connectors, VAEs, vocoder) is not loaded
MODULES = ("patchify_proj", "audio_patchify_proj", "caption_projection", "audio_caption_projection", "adaln_single",
           "audio_adaln_single", "av_ca_video_scale_shift_adaln_single", "av_ca_audio_scale_shift_adaln_single",
           "av_ca_a2v_gate_adaln_single", "av_ca_v2a_gate_adaln_single", "prompt_adaln", "audio_prompt_adaln",
           "scale_shift_table", "audio_scale_shift_table", "transformer_blocks", "proj_out", "audio_proj_out")


def transformer_only(state: dict) -> dict:
    """``state`` (our names) without the entries of a release file that are not the transformer's."""
    return {k: v for k, v in state.items() if k.split(".", 1)[0] in MODULES}


ADAPTER = WeightsAdapter(
    family="LTX2", diffusers_class="LTX2VideoTransformer3DModel", original_prefix="model.diffusion_model.",
    original_extras=("embeddings_connector",), to_diffusers=RENAMES, from_diffusers=INVERSE,
    diffusers_keys=r"^(proj_in|time_embed|av_cross_attn_video_a2v_gate)\.",
    original_keys=r"^(model\.diffusion_model\.)?(patchify_proj|adaln_single|av_ca_a2v_gate_adaln_single)\.",
    unbuilt=transformer_only,
    folder_hint="an LTX-2 transformer folder (diffusers layout), a pipeline folder with transformer/, or the "
                "release's single safetensors file",
    config_hint="flavor: layers, widths; gated attention / cross-attention adaLN (LTX-2.3)")
load_weights = ADAPTER.load_weights
to_diffusers, from_diffusers = ADAPTER.state_to_diffusers, ADAPTER.state_from_diffusers
to_original, from_original = ADAPTER.state_to_original, ADAPTER.state_from_original
