"""Wan 2.2 TI2V's per-token timesteps (the first latent frame's tokens at t = 0) under the token splits: context
parallel (ring, all-to-all) and TP + sequence parallel give the one-process output (gloo, CPU)."""

import pytest
import torch
from gloo_launcher import run_distributed


def _inputs():
    from nemo_vfm.models.wan.model import WanConfig

    cfg = WanConfig(num_layers=2, hidden_size=48, num_heads=4, ffn_size=64, in_channels=4, out_channels=4,
                    context_dim=32, freq_dim=32, text_len=8)
    torch.manual_seed(0)
    net = cfg.build("cpu")
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 3, 4, 4, generator=g)  # 3 x 2 x 2 = 12 tokens per sample
    t = (torch.rand(2, 1, generator=g) * 1000).expand(2, 12).clone()
    t[:, :4] = 0  # the first latent frame's tokens: the clean image
    return net, x, t, torch.randn(2, 8, 32, generator=g)


def _split_forward(rank, world, layout):
    from nemo_vfm.models.wan.family import SPEC
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.mesh import build_mesh

    net, x, t, ctx = _inputs()
    net = SPEC.parallelize(net, build_mesh(ParallelDims(world_size=world, **layout)), param_dtype=None,
                          reduce_dtype=None)
    return net(x, t, context=ctx).detach()


@pytest.mark.parametrize("layout", [dict(cp=2), dict(cp=2, cp_kind="a2a"), dict(tp=2, sequence_parallel=True)],
                         ids=["CP2 ring", "CP2 all-to-all", "TP2 + SP"])
def test_per_token_timesteps_split_like_one_process(layout):
    net, x, t, ctx = _inputs()
    reference = net(x, t, context=ctx).detach()
    for out in run_distributed(_split_forward, 2, layout):
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
