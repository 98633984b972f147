"""The GELU MLP's cuBLASLt GELU-epilogue path on a GPU: used when sampling, equal to GEMM + GELU within bf16
rounding, also under autocast and inside compiled Wan blocks."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nemo_vfm.models.common.mlp import linear_gelu

pytestmark = pytest.mark.gpu


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture
def epilogue_calls(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    calls = []
    real = torch._addmm_activation

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_addmm_activation", counting)
    return calls


def test_epilogue_equals_gemm_then_gelu(epilogue_calls):
    torch.manual_seed(0)
    lin = nn.Linear(1536, 8960).cuda().bfloat16()
    x = torch.randn(2, 4096, 1536, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = F.gelu(F.linear(x.float(), lin.weight.float(), lin.bias.float()), approximate="tanh")
        out = linear_gelu(lin, x)
    assert len(epilogue_calls) == 1 and out.shape == ref.shape and out.dtype == torch.bfloat16
    assert _rel(out, ref) < 1e-2
    lin32 = nn.Linear(1536, 8960).cuda()
    lin32.load_state_dict({k: v.float() for k, v in lin.state_dict().items()})
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():  # fp32 layer, bf16 autocast
        out = linear_gelu(lin32, x.float())
    assert len(epilogue_calls) == 2 and out.dtype == torch.bfloat16 and _rel(out, ref) < 1e-2


def test_compiled_wan_sampling_uses_the_epilogue(epilogue_calls):
    from nemo_vfm.models.wan.flavors import wan_config
    from nemo_vfm.parallel.compile import compile_blocks

    torch.manual_seed(0)
    model = wan_config("tiny").build(device="cuda").bfloat16().eval()
    torch.nn.init.normal_(model.head.head.weight, std=0.02)  # Wan zero-initialises the output layer
    x = torch.randn(2, model.cfg.in_channels, 2, 8, 8, device="cuda", dtype=torch.bfloat16)
    t = torch.tensor([0.3, 0.8], device="cuda")
    ctx = torch.randn(2, 7, model.cfg.context_dim, device="cuda", dtype=torch.bfloat16)
    with torch.enable_grad():
        ref = model(x, t, ctx).detach()  # autograd on: GEMM + GELU
    assert not epilogue_calls
    compile_blocks(model.blocks)
    with torch.no_grad():
        out = model(x, t, ctx)
    assert epilogue_calls  # traced through the epilogue op
    assert ref.abs().mean() > 0 and _rel(out, ref) < 2e-2
