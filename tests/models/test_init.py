"""The initialisation Cosmos, HunyuanVideo and Wan share is one helper (``models/common/init.py``): Xavier linears
with zero biases, unit norms; each family's ``init_weights()`` calls it, and a network built on meta and filled
with NaN comes out initialised everywhere."""

import importlib

import pytest
import torch
from torch import nn

from nemo_vfm.models.common.init import init_linears_and_norms


def test_linears_are_xavier_with_zero_bias_and_norms_are_ones():
    m = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8, bias=False), nn.LayerNorm(8), nn.RMSNorm(8),
                      nn.LayerNorm(8, elementwise_affine=False))
    for p in m.parameters():
        p.data.fill_(float("nan"))
    torch.manual_seed(0)
    init_linears_and_norms(m)
    bound = (6 / (8 + 16)) ** 0.5
    assert torch.all(m[0].weight.abs() <= bound) and m[0].weight.std() > 0 and torch.all(m[0].bias == 0)
    assert torch.all(m[1].weight.abs() <= bound) and torch.isfinite(m[1].weight).all()
    assert torch.all(m[2].weight == 1) and torch.all(m[2].bias == 0) and torch.all(m[3].weight == 1)
    again = nn.Linear(8, 16)
    torch.manual_seed(0)
    init_linears_and_norms(again)
    assert torch.equal(again.weight, m[0].weight)  # seeded: the same draws in module order


@pytest.mark.parametrize("module, flavors, factory", [
    ("nemo_vfm.models.cosmos.model", "nemo_vfm.models.cosmos.flavors", "cosmos_config"),
    ("nemo_vfm.models.hunyuan.model", "nemo_vfm.models.hunyuan.flavors", "hunyuan_config"),
    ("nemo_vfm.models.wan.model", "nemo_vfm.models.wan.flavors", "wan_config"),
])
def test_each_family_initialises_through_the_shared_helper(module, flavors, factory, monkeypatch):
    calls = []
    mod = importlib.import_module(module)
    monkeypatch.setattr(mod, "init_linears_and_norms", lambda net, *a: calls.append(net) or init_linears_and_norms(net, *a))
    net = getattr(importlib.import_module(flavors), factory)("tiny").build("meta")
    net.to_empty(device="cpu")
    for p in net.parameters():
        p.data.fill_(float("nan"))
    net.init_weights()
    assert calls == [net]
    assert not [n for n, p in net.named_parameters() if p.isnan().any()]
