"""Feed-forward layers: the GELU MLP's GEMM-epilogue path is taken only where it applies (CPU), and on a GPU
(``gpu`` marker) it equals GEMM + GELU within bf16 rounding, also under autocast and inside compiled Wan blocks."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from nemo_vfm.models.common import mlp as mlp_mod
from nemo_vfm.models.common.mlp import GeluMLP, linear_gelu


@pytest.fixture
def epilogue_calls(monkeypatch):
    calls = []
    real = torch._addmm_activation

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_addmm_activation", counting)
    return calls


def test_cpu_runs_the_plain_layers(epilogue_calls):
    torch.manual_seed(0)
    mlp, x = GeluMLP(16, 32), torch.randn(2, 5, 16)
    with torch.no_grad():
        out = mlp(x)
    assert torch.equal(out, mlp.fc2(F.gelu(mlp.fc1(x), approximate="tanh"))) and not epilogue_calls


def test_epilogue_only_for_plain_linears_without_autograd(monkeypatch):
    """Autograd, a hooked layer (TP/SP plans), a LoRA-wrapped or bias-free layer keep the plain path."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the device test, not the kernel
    lin, x = nn.Linear(8, 16), torch.randn(3, 8)
    with torch.no_grad():
        assert mlp_mod._gelu_epilogue_applies(lin, x)
        assert not mlp_mod._gelu_epilogue_applies(nn.Linear(8, 16, bias=False), x)
        assert not mlp_mod._gelu_epilogue_applies(nn.Sequential(lin), x)
        hooked = nn.Linear(8, 16)
        hooked.register_forward_pre_hook(lambda m, a: a)
        assert not mlp_mod._gelu_epilogue_applies(hooked, x)
    assert not mlp_mod._gelu_epilogue_applies(lin, x)  # grad enabled: training keeps GELU's backward


def test_wan_ffn_keeps_the_original_names():
    from nemo_vfm.models.wan.model import WanFFN

    ffn = WanFFN(8, 16)
    assert list(ffn.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    x = torch.randn(2, 3, 8)
    assert torch.equal(ffn(x), ffn[2](F.gelu(ffn[0](x), approximate="tanh")))
    assert torch.equal(linear_gelu(ffn[0], x), F.gelu(ffn[0](x), approximate="tanh"))


# -- GPU (run through the device tool) ------------------------------------------------------------------
def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.gpu
def test_epilogue_equals_gemm_then_gelu(epilogue_calls):
    _need_cuda()
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


@pytest.mark.gpu
def test_compiled_wan_sampling_uses_the_epilogue(epilogue_calls):
    _need_cuda()
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
