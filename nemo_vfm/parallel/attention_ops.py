"""Attention on one block of keys that also returns the log-sum-exp, and its backward.

Ring attention needs two primitives per (query block, key block) pair:

- ``forward(q, k, v, mask) -> (out, lse)``: softmax attention of ``q`` over this block only, with
  ``lse = log(sum(exp(scores)))`` per query row, so that blocks can be merged exactly.
- ``backward(dout, q, k, v, out, lse, mask) -> (dq, dk, dv)``: given the *merged* ``out`` and ``lse``
  over all blocks, the gradient contribution of this block (the flash-attention identity
  ``dS = P * (dP - rowsum(dout * out))`` with ``P = exp(scores - lse)``).

Shapes: q (B, H, Sq, D), k and v (B, H, Sk, D), out (B, H, Sq, D), lse (B, H, Sq) float32,
mask bool broadcastable to (B, H, Sq, Sk), True = may attend.

Backends: ``math`` (pure PyTorch, any device, supports masks), ``cpu_flash`` (ATen's CPU flash
kernel), ``flash`` and ``cudnn`` (ATen's CUDA kernels). ``auto`` picks ``math`` when a mask is
given, else ``cudnn`` (CUDA, fp16/bf16, Hopper or newer, head dim a multiple of 8 up to 128), ``flash`` (other
CUDA fp16/bf16), ``cpu_flash`` (CPU, fp32/bf16) or ``math``. cuDNN first on Hopper: forward + backward at head
dim 128 it is the fastest kernel at our sequence lengths (docs/benchmarks.md, "Attention kernels at our shapes"),
which is also why ``F.scaled_dot_product_attention`` runs cuDNN in training.
"""

from __future__ import annotations

import math

import torch

BACKENDS = ("auto", "math", "cpu_flash", "flash", "cudnn")


def resolve_backend(backend: str, q: torch.Tensor, mask: torch.Tensor | None) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"attention backend must be one of {BACKENDS}, got {backend!r}.")
    if mask is not None:
        return "math"
    if backend != "auto":
        return backend
    if q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16):
        return "cudnn" if _cudnn_fits(q) else "flash"
    if q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16):
        return "cpu_flash"
    return "math"


def _cudnn_fits(q: torch.Tensor) -> bool:
    """cuDNN's fused attention takes ``q``: Hopper or newer (where it was measured fastest), head dim 8-128 in
    steps of 8."""
    d = q.shape[-1]
    return (torch.backends.cudnn.is_available() and torch.cuda.get_device_capability(q.device)[0] >= 9
            and d <= 128 and d % 8 == 0)


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])


def block_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
    """Attention of q over one key block: (out (B, H, Sq, D) in q's dtype, lse (B, H, Sq) float32, aux).

    Rows with no key allowed by ``mask`` get out = 0 and lse = -inf. ``aux`` (the kernel's RNG
    state, or None) is handed back to :func:`block_backward`.
    """
    s = _scale(q, scale)
    backend = resolve_backend(backend, q, mask)
    aten = torch.ops.aten
    if backend == "math":
        ct = torch.promote_types(q.dtype, torch.float32)
        scores = torch.matmul(q.to(ct), k.to(ct).transpose(-1, -2)) * s
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        p = torch.exp(scores - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))
        out = torch.matmul(p, v.to(ct)).to(q.dtype)
        return out, lse, None
    if backend == "cpu_flash":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=None, scale=s)
        return out, lse.float(), None
    if backend == "flash":
        res = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False, scale=s)
        return res[0], res[1].float(), (res[6], res[7])
    if backend == "cudnn":
        res = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False, scale=s)
        return res[0], res[1].float().reshape(q.shape[:3]), (res[6], res[7])
    raise AssertionError(backend)


def block_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    mask: torch.Tensor | None = None,
    aux: tuple | None = None,
    *,
    scale: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradient contribution of one key block, given the merged ``out`` and ``lse`` of all blocks."""
    s = _scale(q, scale)
    backend = resolve_backend(backend, q, mask)
    aten = torch.ops.aten
    if backend == "math":
        ct = torch.promote_types(q.dtype, torch.float32)
        qf, kf, vf, dof = q.to(ct), k.to(ct), v.to(ct), dout.to(ct)
        scores = torch.matmul(qf, kf.transpose(-1, -2)) * s
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        p = torch.exp(scores - lse.unsqueeze(-1).masked_fill(torch.isinf(lse).unsqueeze(-1), 0.0))
        dv = torch.matmul(p.transpose(-1, -2), dof)
        dp = torch.matmul(dof, vf.transpose(-1, -2))
        delta = (dof * out.to(ct)).sum(-1, keepdim=True)
        ds = p * (dp - delta)
        dq = torch.matmul(ds, kf) * s
        dk = torch.matmul(ds.transpose(-1, -2), qf) * s
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    out = out.to(q.dtype)
    dout = dout.to(q.dtype).contiguous()
    if backend == "cpu_flash":
        lse_t = lse.to(torch.float32 if q.dtype == torch.float32 else lse.dtype)
        dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse_t, 0.0, False, attn_mask=None, scale=s
        )
        return dq, dk, dv
    if backend == "flash":
        seed, offset = aux
        dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse.contiguous(), None, None, q.shape[2], k.shape[2], 0.0, False, seed, offset,
            scale=s,
        )
        return dq, dk, dv
    if backend == "cudnn":
        seed, offset = aux
        dq, dk, dv = aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse.unsqueeze(-1).contiguous(), seed, offset, None, None, None,
            q.shape[2], k.shape[2], 0.0, False, scale=s,
        )
        return dq, dk, dv
    raise AssertionError(backend)


def merge(
    out: torch.Tensor | None, lse: torch.Tensor | None, out_i: torch.Tensor, lse_i: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial softmax results: (out float32 (B, H, S, D), lse (B, H, S)). -inf safe."""
    out_i = out_i.to(torch.promote_types(out_i.dtype, torch.float32))
    if out is None:
        return out_i, lse_i
    new = torch.logaddexp(lse, lse_i)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    w = torch.exp(lse - safe).unsqueeze(-1)
    w_i = torch.exp(lse_i - safe).unsqueeze(-1)
    return out * w + out_i * w_i, new
