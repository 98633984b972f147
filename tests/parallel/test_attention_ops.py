"""nemo_vfm.parallel.attention_ops: ring attention's per-block kernels merge into exact attention, on every backend."""

import pytest
import torch

from nemo_vfm.parallel import attention_ops as ops


def _blockwise(q, k, v, dout, backend, blocks=2):
    """Attention of q over k, v cut into key blocks (as the ring runs it): merged out, and dq, dk, dv."""
    s = k.shape[2] // blocks
    kv = torch.stack([k, v]).contiguous()  # the ring's buffer: every block is a slice of it
    parts = [(kv[0, :, :, i * s:(i + 1) * s], kv[1, :, :, i * s:(i + 1) * s]) for i in range(blocks)]
    out = lse = aux0 = None
    for kb, vb in parts:
        o_i, lse_i, aux = ops.block_forward(q, kb, vb, backend=backend)
        aux0 = aux0 if aux0 is not None else aux
        out, lse = ops.merge(out, lse, o_i, lse_i)
    out = out.to(q.dtype)
    grads = [ops.block_backward(dout, q, kb, vb, out, lse, None, aux0, backend=backend) for kb, vb in parts]
    dq = sum(g[0].float() for g in grads)
    dk = torch.cat([g[1].float() for g in grads], 2)
    dv = torch.cat([g[2].float() for g in grads], 2)
    return out.float(), dq, dk, dv


def _reference(q, k, v, dout):
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ v
    out.backward(dout.double())
    return out, q.grad, k.grad, v.grad


def _inputs(device, dtype, b=1, h=4, s=256, d=64):
    g = torch.Generator(device="cpu").manual_seed(0)
    # q as the model makes it: (B, S, H, D) projections viewed as (B, H, S, D), not contiguous
    q = torch.randn(b, s, h, d, generator=g).to(device, dtype).transpose(1, 2)
    k, v, dout = (torch.randn(b, h, s, d, generator=g).to(device, dtype) for _ in range(3))
    return q, k, v, dout


def test_auto_is_math_with_a_mask_and_the_cpu_kernel_without():
    q = torch.randn(1, 2, 8, 16)
    assert ops.resolve_backend("auto", q, torch.ones(8, 8, dtype=torch.bool)) == "math"
    assert ops.resolve_backend("auto", q, None) == "cpu_flash"
    assert ops.resolve_backend("auto", q.double(), None) == "math"
    with pytest.raises(ValueError, match="attention backend must be one of"):
        ops.resolve_backend("efficient", q, None)


@pytest.mark.parametrize("backend", ["math", "cpu_flash"])
def test_cpu_blocks_merge_into_full_attention(backend):
    q, k, v, dout = _inputs("cpu", torch.float32)
    got = _blockwise(q, k, v, dout, backend)
    for a, b in zip(got, _reference(q, k, v, dout)):
        torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cudnn", "flash"])
def test_cuda_blocks_merge_into_full_attention(backend):
    """The cuDNN and flash block kernels, forward and backward from the merged out and log-sum-exp, against fp64
    attention (bf16 inputs: errors of bf16's rounding); ``auto`` picks cuDNN on Hopper at head dim 128."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    q, k, v, dout = _inputs("cuda", torch.bfloat16, b=2, h=8, s=2048, d=128)
    if torch.cuda.get_device_capability()[0] >= 9:
        assert ops.resolve_backend("auto", q, None) == "cudnn"
    got = _blockwise(q, k, v, dout, backend, blocks=4)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, _reference(q, k, v, dout)):
        rel = (a.double() - b).norm() / b.norm()
        assert rel < 1e-2, f"{backend} {name}: relative error {rel:.2e}"
