"""Wan 2.2 objectives: TI2V's clean first frame (time 0 on its tokens, no loss on it) and the A14B experts' time
ranges (the flow-matching time distribution restricted to [boundary, 1] or [0, boundary))."""

import pytest
import torch

from nemo_vfm.diffusion.experts import ExpertFlowMatching, switch_experts, uses_high
from nemo_vfm.diffusion.first_frame import FirstFrameFlowMatching, keep_first_frame, token_times
from nemo_vfm.diffusion.flow_matching import FlowMatching


@pytest.mark.parametrize("sampling", ["uniform", "logit_normal"])
def test_expert_times_are_the_restricted_distribution(sampling):
    kw = dict(shift=5.0, time_sampling=sampling)
    g = torch.Generator().manual_seed(0)
    full = FlowMatching(**kw).sample_time(400_000, g)
    for expert, keep in (("high", full >= 0.875), ("low", full < 0.875)):
        t = ExpertFlowMatching(expert=expert, boundary=0.875, **kw).sample_time(100_000, torch.Generator().manual_seed(1))
        assert (t >= 0.875).all() if expert == "high" else (t < 0.875).all()
        ref = full[keep]
        for q in (0.1, 0.5, 0.9):  # same quantiles as rejection sampling from the full distribution
            assert abs(torch.quantile(t[:50_000], q) - torch.quantile(ref[:50_000], q)) < 0.01, (expert, q)
    with pytest.raises(ValueError, match="expert"):
        ExpertFlowMatching(expert="mid")
    with pytest.raises(ValueError, match="boundary"):
        ExpertFlowMatching(boundary=1.0)


def test_switch_experts_follows_diffusers_boundary_rule():
    calls = []
    f = switch_experts(lambda x, t: calls.append("high"), lambda x, t: calls.append("low"), 0.9)
    for t in (1.0, 0.9, 0.899, 0.2):  # diffusers: t >= boundary_ratio * 1000 on its integer timesteps
        f(None, torch.full((2,), t))
    assert calls == ["high", "high", "low", "low"]
    assert uses_high(torch.tensor([900 / 1000], dtype=torch.float32), 0.9)  # float32 0.9 < 0.9 (float64)


def test_first_frame_training_input_and_loss():
    obj = FirstFrameFlowMatching(shift=5.0, time_sampling="uniform", image_prob=1.0, patch_size=(1, 2, 2))
    x0 = torch.randn(3, 4, 3, 4, 6)
    inp = obj.training_input(x0, torch.Generator().manual_seed(0))
    assert torch.equal(inp.x[:, :, 0], x0[:, :, 0]) and not torch.equal(inp.x[:, :, 1:], x0[:, :, 1:])
    assert inp.timesteps.shape == (3, 3 * 2 * 3)
    assert inp.timesteps[:, :6].eq(0).all() and torch.equal(inp.timesteps[:, 6:], inp.level[:, None].expand(3, 12))
    out = torch.randn_like(x0)
    loss, logs = obj.loss_from_output(out, inp)
    out2 = out.clone()
    out2[:, :, 0] += 100.0  # the conditioning frame carries no loss
    assert torch.equal(obj.loss_from_output(out2, inp)[0], loss)
    target = (inp.noise - x0)[:, :, 1:]
    assert torch.allclose(loss, ((out[:, :, 1:] - target) ** 2).mean())
    shares = [obj.micro_batch_loss(out[i:i + 1], inp, None, torch.tensor([i])) for i in range(3)]
    assert torch.allclose(sum(shares), loss)
    mask = torch.zeros(3, 3, 4, 6)
    mask[:, 2] = 1  # the data's loss mask combines with the frame weights
    assert torch.allclose(obj.loss_from_output(out, inp, mask)[0], ((out[:, :, 2] - (inp.noise - x0)[:, :, 2]) ** 2).mean())


def test_first_frame_without_image_is_plain_flow_matching():
    """image_prob = 0 draws and scores as FlowMatching (same times and noise; per-token times all t)."""
    x0 = torch.randn(2, 4, 2, 4, 4)
    a = FirstFrameFlowMatching(shift=3.0, image_prob=0.0).training_input(x0, torch.Generator().manual_seed(4))
    b = FlowMatching(shift=3.0).training_input(x0, torch.Generator().manual_seed(4))
    assert torch.equal(a.x, b.x) and torch.equal(a.noise, b.noise) and torch.equal(a.level, b.level)
    assert torch.equal(a.timesteps, b.timesteps[:, None].expand(2, 8))
    out = torch.randn_like(x0)
    assert torch.allclose(FirstFrameFlowMatching(image_prob=0.0).loss_from_output(out, a)[0],
                          FlowMatching().loss_from_output(out, b)[0])
    with pytest.raises(ValueError, match="patch_size"):
        FirstFrameFlowMatching(patch_size=(2, 2, 2))


def test_first_frame_trains_a_wan_network_and_samples_with_the_image_kept():
    from nemo_vfm.models.wan.flavors import wan_config, wan_objective

    net = wan_config("tiny", in_channels=4, out_channels=4).build()
    obj = wan_objective("ti2v_5b", image_prob=0.5)
    assert isinstance(obj, FirstFrameFlowMatching) and obj.shift == 5.0 and obj.time_sampling == "uniform"
    x0 = torch.randn(4, 4, 2, 4, 4)
    ctx = torch.randn(4, 3, 16)
    loss, _ = obj.training_loss(net, x0, {"context": ctx}, generator=torch.Generator().manual_seed(1))
    loss.backward()
    assert torch.isfinite(loss) and net.head.head.weight.grad.abs().sum() > 0  # adaLN-Zero: the head learns first
    first = torch.randn(4, 4, 1, 4, 4)
    seen = []

    def spy(x, t, **cond):
        seen.append((x, t))
        return net(x, t, **cond)

    v = obj.velocity(spy, torch.randn_like(x0), torch.full((4,), 0.7), {"context": ctx, "first_frame": first})
    assert v.shape == x0.shape and torch.equal(seen[0][0][:, :, :1], first) and seen[0][1][:, :4].eq(0).all()
    assert torch.equal(keep_first_frame(torch.zeros_like(x0), {"first_frame": first})[:, :, :1], first)
    assert token_times(torch.tensor([0.5]), torch.tensor([False]), (1, 4, 2, 4, 4), (1, 2, 2)).eq(0.5).all()
