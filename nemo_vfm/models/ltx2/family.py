"""The LTX-2 family, declared: :data:`SPEC`, applied by the generic :func:`nemo_vfm.parallel.parallelize.parallelize`.

Tensor parallel: in each of a block's six attentions (video / audio self-attention, video / audio text
cross-attention, audio-to-video, video-to-audio) q, k, v and the per-head gate are column-parallel and ``to_out.0``
row-parallel, so each TP rank runs its heads (the video heads, or the audio heads in the audio and cross-modal
attentions); both feed-forwards are split the Megatron way. LTX-2's QK RMSNorm spans all heads: each norm all-reduces
its mean square over TP and uses its slice of the (replicated) weight, whose gradient is summed over TP
(``TP_PARTIAL``); its RoPE gives every head its own frequencies, so each attention rotates its local heads with their
slice of the tables (:class:`~nemo_vfm.models.ltx2.attention.LTX2Attention`, given the TP group). Embedders,
modulation tables and output projections are replicated.

Context parallel (ring or all-to-all): the video tokens, their per-token modulations and RoPE tables are split over
the CP ranks (``TOKEN_SPLIT``; a count that does not divide is padded) and gathered after the video head; the audio
stream is small (25 tokens per second) and replicated: every CP rank runs all audio tokens. The video
self-attention core becomes the ring / all-to-all core; the video-to-audio attention (audio queries over video keys)
all-gathers the video keys and values (:class:`GatheredKeysCore`, padding cut), whose backward sums the ranks'
gradients; the audio-to-video attention needs nothing (local video queries, all audio keys).

Not offered (:func:`check_layout` raises before anything is built): sequence parallelism and pipeline parallelism.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nemo_vfm.models.ltx2.attention import LTX2Attention
from nemo_vfm.models.ltx2.comfy_lora import comfyui_lora_state
from nemo_vfm.models.ltx2.convert import save_weights
from nemo_vfm.models.ltx2.flops import ltx2_forward_flops, memory_streams
from nemo_vfm.models.ltx2.model import LTX2Config
from nemo_vfm.models.ltx2.weights import ADAPTER
from nemo_vfm.models.spec import COMMON_KNOBS, FamilySpec, TokenSplit
from nemo_vfm.models.wan.norms import WanRMSNorm
from nemo_vfm.parallel import context_parallel as cpl
from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.parallelize import replace_cores

ATTENTIONS = ("attn1", "attn2", "audio_attn1", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
TP_PLAN: dict[str, str] = {
    f"{a}.{p}": style for a in ATTENTIONS
    for p, style in (("to_q", "colwise"), ("to_k", "colwise"), ("to_v", "colwise"), ("to_out.0", "rowwise"),
                     ("to_gate_logits", "colwise"))
}
TP_PLAN.update({"ff.net.0.proj": "colwise", "ff.net.2": "rowwise",
                "audio_ff.net.0.proj": "colwise", "audio_ff.net.2": "rowwise"})
TP_OPTIONAL = frozenset(f"{a}.to_gate_logits" for a in ATTENTIONS)  # gated_attn / audio_gated_attn only
TP_PARTIAL = ("transformer_blocks.*.q_norm.weight", "transformer_blocks.*.k_norm.weight")
# the video tokens, their per-token modulations and RoPE tables; the audio stream and the text stay whole
TOKEN_SPLIT = TokenSplit(tokens=("x_BSD",), per_token_cond=("c", "c_av"), rope="rope", masks=("attn_mask",),
                         seg_ids=None)
VIDEO_SELF_ATTENTION = "attn1.core"
VIDEO_KEYS_ATTENTION = "video_to_audio_attn.core"
KNOBS = COMMON_KNOBS  # no fused q/k/v, no FP8 linears


class GatheredKeysCore(cpl.ContextParallelCore):
    """The video-to-audio attention core under CP: the audio queries (every rank holds all of them) attend to the
    video keys and values of all CP ranks, all-gathered (backward: the ranks' gradients summed) and cut to the
    ``valid_len`` real tokens (the token split sets it, as for the self-attention cores)."""

    def forward(self, q, k, v, mask=None):
        from torch.distributed.nn.functional import all_gather

        if mask is not None:
            raise NotImplementedError("a video-to-audio attention mask under context parallelism is not supported")
        k, v = (torch.cat(all_gather(t.contiguous(), group=self.group), dim=2) for t in (k, v))
        if self.valid_len is not None:
            k, v = k[:, :, : self.valid_len], v[:, :, : self.valid_len]
        return F.scaled_dot_product_attention(q, k, v)


def install_cp(blocks, pmesh, attention_backend: str) -> None:
    """Ring / all-to-all core for the video self-attention, :class:`GatheredKeysCore` for video-to-audio."""
    replace_cores(blocks, pmesh, attention_backend, (VIDEO_SELF_ATTENTION,))
    replace_cores(blocks, pmesh, attention_backend, (VIDEO_KEYS_ATTENTION,), GatheredKeysCore)


def check_layout(cfg, dims: ParallelDims, latent_shape: tuple[int, int, int] | None = None) -> None:
    """Fail before building anything if ``cfg`` (an LTX2Config) does not fit ``dims``."""
    if dims.pp > 1:
        raise ValueError(f"LTX-2 has no pipeline-parallel plan (pp={dims.pp}); use pipeline_model_parallel_size=1 "
                         "with FSDP2, context parallel and/or tensor parallel instead.")
    if dims.sequence_parallel:
        raise NotImplementedError("sequence parallelism is not implemented for LTX-2 (its audio stream is not split); "
                                  "set sequence_parallel=False (tensor parallel works without it).")
    if dims.tp > 1 and cfg.audio_num_heads % dims.tp:
        raise ValueError(f"LTX-2 audio_num_heads={cfg.audio_num_heads} must be divisible by tp={dims.tp} (the audio "
                         "and cross-modal attentions are split by heads)")
    tokens = None
    if latent_shape is not None:
        tokens = 1
        for n, p in zip(latent_shape, cfg.patch_size):
            tokens *= n // p
    dims.check_model(num_heads=cfg.num_heads, num_layers=cfg.num_layers, num_tokens=tokens, pad_tokens=True)


SPEC = FamilySpec(name="ltx2", config=LTX2Config, check_layout=check_layout, knobs=KNOBS, tp_plan=TP_PLAN,
                  tp_optional=TP_OPTIONAL, sp_input_arity={}, token_split=TOKEN_SPLIT, install_cp=install_cp,
                  tp_group_types=(WanRMSNorm, LTX2Attention), tp_partial=TP_PARTIAL, flops=ltx2_forward_flops,
                  memory_streams=memory_streams, weights=ADAPTER, save_weights=save_weights,
                  comfyui_lora=comfyui_lora_state)
