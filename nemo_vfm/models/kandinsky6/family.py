"""The Kandinsky 6 family, declared: :data:`SPEC`, applied by the generic
:func:`nemo_vfm.parallel.parallelize.parallelize` to the fused video/audio blocks (``model.blocks``); the two text
branches, the embeddings and the output layers stay replicated.

Tensor parallel: every attention's ``to_query`` / ``to_key`` / ``to_value`` and each FFN's ``in_layer``
column-wise, ``out_layer`` row-wise, in both streams and both cross-modal attentions (q/k RMSNorms are per head,
so they need no TP group; their weights' gradients are summed over TP: ``TP_PARTIAL``). Sequence parallelism is not
implemented (the audio stream is not split): :func:`check_layout` refuses it.

Context parallel: the video tokens are split before block 0 and gathered after the video head; the video
self-attention's core becomes the ring / all-to-all core. Audio and text stay whole on every rank: video queries
attend to all audio keys locally, and the audio-from-video cross-attention gathers the video keys and values over
CP (:class:`GatherKeysCore`; its backward sums the ranks' gradients of the gathered keys: each holds the contributions
of that rank's video-loss share, which reached the replicated audio stream, besides the audio loss's). Video token counts must
divide cp (no padding: ``pad_tokens=False``). No pipeline plan.
"""

from __future__ import annotations

import torch
from torch import nn

from nemo_vfm.models.kandinsky6.convert import save_weights
from nemo_vfm.models.kandinsky6.flops import kandinsky6_forward_flops, memory_streams
from nemo_vfm.models.kandinsky6.model import Kandinsky6Config
from nemo_vfm.models.kandinsky6.weights import ADAPTER
from nemo_vfm.models.spec import COMMON_KNOBS, FamilySpec, TokenSplit
from nemo_vfm.parallel.dims import ParallelDims

_ATTN = ("to_query", "to_key", "to_value")
TP_PLAN: dict[str, str] = {}
for _m in ("video.self_attention", "video.cross_attention", "audio.self_attention", "audio.cross_attention",
           "va_cross_attention", "av_cross_attention"):
    TP_PLAN.update({f"{_m}.{p}": "colwise" for p in _ATTN} | {f"{_m}.out_layer": "rowwise"})
for _s in ("video", "audio"):
    TP_PLAN.update({f"{_s}.feed_forward.in_layer": "colwise", f"{_s}.feed_forward.out_layer": "rowwise"})
TOKEN_SPLIT = TokenSplit(tokens=("x_BSD",), per_token_cond=(), rope="rope", masks=(), seg_ids=None)
SELF_ATTENTION_CORES = ("video.self_attention.core",)
GATHERED_KEY_CORES = ("av_cross_attention.core",)
TP_PARTIAL = ("blocks.*.query_norm.weight", "blocks.*.key_norm.weight")


class _GatherSum(torch.autograd.Function):
    """All-gather along dim 2 over ``group``; backward: the gradient summed over the group (reduce-scatter), since
    each rank's gradient of the gathered keys holds its own queries' (and its own video tokens') contributions."""

    @staticmethod
    def forward(ctx, x, group):
        import torch.distributed as dist

        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, g):
        import torch.distributed as dist

        parts = [p.contiguous() for p in g.chunk(dist.get_world_size(ctx.group), dim=2)]
        out = torch.empty_like(parts[0])
        dist.reduce_scatter(out, parts, group=ctx.group)
        return out, None


class GatherKeysCore(nn.Module):
    """A cross-attention core whose keys / values ``(B, Hn, S_local, Dh)`` are CP-split video tokens: all-gathered
    over the CP group before ``inner`` (backward: reduce-scatter)."""

    def __init__(self, group, inner: nn.Module):
        super().__init__()
        self.group, self.inner = group, inner

    def forward(self, q, k, v, mask=None) -> torch.Tensor:
        return self.inner(q, _GatherSum.apply(k, self.group), _GatherSum.apply(v, self.group), mask)


def install_cp(blocks, pmesh, attention_backend: str) -> None:
    """The video self-attention cores -> ring / all-to-all CP cores; the audio-from-video cross-attention cores ->
    :class:`GatherKeysCore`."""
    from nemo_vfm.parallel.parallelize import replace_cores

    replace_cores(blocks, pmesh, attention_backend, SELF_ATTENTION_CORES)
    group = pmesh.group("cp")
    for block in blocks:
        for path in GATHERED_KEY_CORES:
            parent_path, _, attr = path.rpartition(".")
            parent = block.get_submodule(parent_path)
            setattr(parent, attr, GatherKeysCore(group, getattr(parent, attr)))


def check_layout(cfg: Kandinsky6Config, dims: ParallelDims, latent_shape: tuple[int, int, int] | None = None) -> None:
    """Fail before building anything if ``cfg`` does not fit ``dims`` (both streams' heads divide tp; video tokens
    divide cp; no pipeline or sequence parallelism)."""
    if dims.pp > 1:
        raise ValueError(f"Kandinsky 6 has no pipeline-parallel plan (pp={dims.pp}); use FSDP2, context parallel and/or "
                         "tensor parallel instead")
    if dims.sequence_parallel:
        raise ValueError("sequence parallelism is not implemented for Kandinsky 6 (its audio stream is not split); "
                         "set sequence_parallel=False")
    audio_heads = cfg.audio_dim // cfg.audio_head_dim
    if audio_heads % dims.tp:
        raise ValueError(f"the audio stream's {audio_heads} heads are not divisible by tensor parallel size "
                         f"tp={dims.tp}; pick tp among their divisors")
    tokens = None
    if latent_shape is not None:
        tokens = 1
        for n, p in zip(latent_shape, cfg.patch_size):
            tokens *= n // p
    dims.check_model(num_heads=cfg.num_heads, num_layers=cfg.num_layers, num_tokens=tokens, pad_tokens=False)


def comfyui_lora(lora_state, cfg, rank, alpha, dtype):
    """Not built: the key convention of ComfyUI's Kandinsky 6 nodes (kandinskylab's ``kandinsky6`` custom nodes) for
    LoRA files is not known to nemo-vfm, so no ComfyUI layout is written."""
    raise NotImplementedError("a ComfyUI LoRA layout for Kandinsky 6 is not built: the LoRA key convention of "
                              "ComfyUI's Kandinsky 6 nodes is not known to nemo-vfm; export with --format lora "
                              "(diffusers/peft layout) instead")


SPEC = FamilySpec(name="kandinsky6", config=Kandinsky6Config, check_layout=check_layout, knobs=COMMON_KNOBS,
                  tp_plan=TP_PLAN, sp_input_arity={}, token_split=TOKEN_SPLIT, pad_tokens=False,
                  self_attention_cores=SELF_ATTENTION_CORES, install_cp=install_cp, tp_partial=TP_PARTIAL,
                  flops=kandinsky6_forward_flops, memory_streams=memory_streams, weights=ADAPTER,
                  save_weights=save_weights, comfyui_lora=comfyui_lora)
