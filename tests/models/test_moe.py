"""The MoE feed-forward layer: routing, grouped GEMM vs the per-expert loop, the load-balancing loss, router
statistics, and its place in the DiT and MovieGen blocks."""

import pytest
import torch

from nemo_vfm.models.common.moe import GroupedExperts, MoE, MoEConfig, collect_aux_loss, router_stats


def _layer(**kw):
    torch.manual_seed(0)
    m = MoE(MoEConfig(num_experts=4, expert_ffn_size=16, gemm="loop", **kw), 8)
    m.init_weights()
    return m


def _run(m, x):
    x = x.clone().requires_grad_(True)
    y = m(x)
    loss = y.square().sum() + (m.aux_loss if m.aux_loss is not None else 0)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    return y.detach(), x.grad, grads


@pytest.mark.parametrize("routing", ["expert_choice", "top_k"])
def test_grouped_gemm_equals_the_loop(routing):
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm is missing in this torch")
    m = _layer(routing=routing, num_shared_experts=1)
    x = torch.randn(3, 10, 8)
    ref = _run(m, x)
    m.experts.gemm = "grouped"
    got = _run(m, x)
    assert torch.allclose(got[0], ref[0], atol=1e-5) and torch.allclose(got[1], ref[1], atol=1e-5)
    for n in ref[2]:
        assert torch.allclose(got[2][n], ref[2][n], atol=1e-5), n


@pytest.mark.parametrize("gemm", ["loop", "grouped"])
def test_bf16_autocast(gemm):
    """Under autocast the experts run in bf16 (torch._grouped_mm is not an autocast op) and the layer's output
    adds to the fp32 residual stream."""
    if gemm == "grouped" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm is missing in this torch")
    m = _layer(routing="top_k", num_shared_experts=1)
    m.experts.gemm = gemm
    x = torch.randn(2, 10, 8)
    ref = m(x)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x)
    except RuntimeError as e:  # a CPU build without bf16 grouped GEMM
        pytest.skip(f"bf16 {gemm} GEMM on this CPU: {e}")
    assert y.dtype == torch.bfloat16 and (x + y).dtype == torch.float32
    assert torch.allclose(y.float(), ref, atol=0.05, rtol=0.05)


def test_loop_is_a_per_expert_swiglu():
    torch.manual_seed(0)
    ex = GroupedExperts(3, 4, 5)
    ex.init_weights()
    x, counts = torch.randn(7, 4), torch.tensor([2, 0, 5])
    y = ex(x, counts)
    e = [0, 0, 2, 2, 2, 2, 2]
    want = torch.stack([(torch.nn.functional.silu(x[i] @ ex.w1[e[i]]) * (x[i] @ ex.w3[e[i]])) @ ex.w2[e[i]]
                        for i in range(7)])
    assert torch.allclose(y, want, atol=1e-5)


def test_expert_choice_takes_k_tokens_per_expert_and_sequence():
    m = _layer(routing="expert_choice", capacity_factor=2.0)
    x = torch.randn(2, 10, 8)
    y = m(x)
    stats = router_stats(m)
    k = int(2.0 * 10 / 4)
    assert stats["moe/tokens_per_expert"].tolist() == [2 * k] * 4 and stats["moe/max_load"] == 1.0
    assert m.aux_loss is None and y.shape == x.shape
    # a token no expert took gets zero output (no shared experts)
    scores = m._scores(x)
    chosen = torch.zeros(2, 10, dtype=torch.bool)
    for b in range(2):
        for e in range(4):
            chosen[b, scores[b, :, e].topk(k).indices] = True
    assert torch.all(y[~chosen] == 0) and torch.all(y[chosen].abs().sum(-1) > 0)
    assert abs(stats["moe/unrouted"].item() - (~chosen).float().mean().item()) < 1e-6
    # the threshold path (used when a sequence is split over ranks or padded) selects the same tokens
    m.valid_fn = lambda S, device: torch.ones(S, dtype=torch.bool, device=device)
    assert torch.allclose(m(x), y)


def test_expert_choice_ignores_padding_tokens():
    m = _layer(routing="expert_choice", capacity_factor=2.0)
    x = torch.randn(1, 12, 8)
    valid = torch.arange(12) < 9
    m.valid_fn = lambda S, device: valid
    y = m(x)
    m.valid_fn = None
    ref = m(x[:, :9])  # the same sequence without its 3 pad tokens
    assert torch.allclose(y[:, :9], ref, atol=1e-6) and torch.all(y[:, 9:] == 0)


def test_top_k_load_balancing_loss():
    m = _layer(routing="top_k", top_k=2, aux_loss_coef=0.5)
    x = torch.randn(2, 10, 8)
    m(x)
    scores = m._scores(x)
    idx = scores.topk(2, -1).indices
    f = torch.nn.functional.one_hot(idx, 4).sum(2).float().mean(1) / 2  # (B, E)
    want = 0.5 * 4 * (f * scores.mean(1)).sum(1).mean()
    assert torch.allclose(m.aux_loss, want) and torch.allclose(collect_aux_loss(m), want)
    m.aux_loss.backward()
    assert m.router.weight.grad.abs().sum() > 0
    m.eval()
    m(x)
    assert m.aux_loss is None  # only while training


def test_config_checks():
    with pytest.raises(ValueError, match="routing"):
        MoEConfig(routing="hash")
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig(num_experts=2, top_k=3)
    assert MoEConfig(every=2).is_moe_layer(1) and not MoEConfig(every=2).is_moe_layer(0)
    assert MoEConfig(expert_ffn_size=1024, capacity_factor=8.0).active_ffn_size() == 8192


@pytest.mark.parametrize("family", ["dit", "moviegen"])
def test_models_with_moe_blocks_forward_unpacked_and_packed(family):
    from bench.equivalence import make_packed_problem, tiny_config

    moe = MoEConfig(num_experts=4, expert_ffn_size=32, every=2, routing="top_k", gemm="loop")
    if family == "dit":
        cfg = tiny_config(moe=moe)
    else:
        from nemo_vfm.models.moviegen.flavors import moviegen_config

        cfg = moviegen_config("tiny", in_channels=4, context_dim=32, moe=moe)
    torch.manual_seed(0)
    net = cfg.build("cpu")
    assert [isinstance(b.mlp, MoE) for b in net.blocks] == [i % 2 == 1 for i in range(cfg.num_layers)]
    x = torch.randn(2, 4, 2, 4, 4)
    out = net(x, torch.rand(2), context=torch.randn(2, 5, 32))
    assert out.shape == x.shape and collect_aux_loss(net) is not None
    p = make_packed_problem(cfg)
    out = net(p["x_noisy"], p["c_noise"], context=p["context"], packed=p["packed"])
    assert out.shape == p["x0"].shape
