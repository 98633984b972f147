"""nemo_vfm.parallel.sdpa_backend: the narrowed kernel choices keep math as the last resort."""

import pytest
import torch
import torch.nn.functional as F

from nemo_vfm.parallel.sdpa_backend import SDPA_BACKENDS, select_sdpa_backend


@pytest.fixture
def restore_flags():
    yield
    select_sdpa_backend("default")


def test_every_setting_keeps_math_as_the_last_resort(restore_flags):
    b = torch.backends.cuda
    expected = {"cudnn": (False, True, True), "flash": (True, True, False), "efficient": (False, True, False),
                "math": (False, False, False), "default": (True, True, True)}
    for name in SDPA_BACKENDS:
        chosen = select_sdpa_backend(name)
        assert (b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.cudnn_sdp_enabled()) == expected[chosen]
        assert b.math_sdp_enabled()
    q = torch.randn(1, 2, 8, 16)
    select_sdpa_backend("cudnn")  # no fused CPU kernel left: math runs a masked call instead of failing
    out = F.scaled_dot_product_attention(q, q, q, attn_mask=torch.randn(1, 2, 8, 8))
    assert out.shape == q.shape
    with pytest.raises(ValueError, match="attention backend must be one of"):
        select_sdpa_backend("fastest")


def _kernels(fn) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(e.key for e in prof.key_averages())


@pytest.mark.gpu
def test_on_hopper_the_dit_shapes_still_run_fused_kernels_not_math(restore_flags):
    """Math on as the last resort does not take what cuDNN or the efficient kernel runs: a DiT self-attention
    (bf16, head dim 128) runs cuDNN's kernel, a masked cross-attention a fused one, a float-biased fp32 call
    (UMT5's kind) math."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs a Hopper GPU")
    select_sdpa_backend("cudnn")
    q = torch.randn(1, 16, 4096, 128, device="cuda", dtype=torch.bfloat16)
    assert "cudnn" in _kernels(lambda: F.scaled_dot_product_attention(q, q, q)).lower()
    kv = torch.randn(1, 16, 512, 128, device="cuda", dtype=torch.bfloat16)
    mask = torch.rand(1, 1, 4096, 512, device="cuda") > 0.2
    masked = _kernels(lambda: F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask)).lower()
    assert "fmha" in masked or "cudnn" in masked or "efficient" in masked
    x = torch.randn(1, 4, 64, 64, device="cuda")
    bias = torch.randn(1, 4, 64, 64, device="cuda")
    assert F.scaled_dot_product_attention(x, x, x, attn_mask=bias, scale=1.0).isfinite().all()
