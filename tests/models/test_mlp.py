"""Feed-forward layers: the GELU MLP's GEMM-epilogue path is taken only where it is exact to use."""

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
