import pytest
import torch

from nemo_vfm.data.synthetic_video import ShapeClipSpec, make_clip
from nemo_vfm.diffusion import samplers
from nemo_vfm.diffusion.conditioning import drop_condition, guided, null_condition
from nemo_vfm.diffusion.edm import EDM, masked_mean
from nemo_vfm.diffusion.flow_matching import FlowMatching
from nemo_vfm.io.video import frames_to_tensor
from nemo_vfm.models.dit.flavors import dit_config


def test_preconditioning_identities():
    edm = EDM(sigma_data=0.5)
    sigma = torch.tensor([0.01, 0.5, 10.0])
    c_skip, c_out, c_in, c_noise = edm.precondition(sigma)
    # unit variance of the network input and target (EDM eq. 7/8)
    assert torch.allclose(c_in**2 * (sigma**2 + 0.25), torch.ones(3))
    # the effective training target (x0 - c_skip (x0 + sigma n)) / c_out has unit variance (EDM eq. 8)
    target_var = ((1 - c_skip) ** 2 * 0.25 + c_skip**2 * sigma**2) / c_out**2
    assert torch.allclose(target_var, torch.ones(3))
    assert torch.allclose(edm.loss_weight(sigma) * c_out**2, torch.ones(3))  # lambda = 1 / c_out^2
    assert torch.allclose(c_noise, sigma.log() / 4)


def test_x0_prediction_preconditioning_and_capped_weight():
    edm = EDM(sigma_data=0.5, prediction="x0")
    sigma = torch.tensor([0.01, 0.5, 10.0])
    c_skip, c_out, c_in, _ = edm.precondition(sigma)
    assert torch.all(c_skip == 0) and torch.allclose(c_out, torch.full((3,), 0.5))  # D = sigma_data * F
    assert torch.allclose(c_in**2 * (sigma**2 + 0.25), torch.ones(3))
    # weight on the network's own error: 1 + SNR, capped at 1 + 5
    w = edm.loss_weight(sigma) * c_out**2
    assert torch.allclose(w, torch.tensor([6.0, 2.0, 1.0025]))
    x, s = torch.randn(2, 3, 1, 4, 4), torch.tensor([0.3, 3.0])
    out = edm.denoise(lambda xin, t: torch.ones_like(xin), x, s, {})
    assert torch.allclose(out, torch.full_like(x, 0.5))  # the input does not pass through
    with pytest.raises(ValueError, match="prediction"):
        EDM(prediction="eps")


def test_lognormal_sigma_statistics():
    edm = EDM(p_mean=-1.2, p_std=1.2)
    s = edm.sample_sigma(200_000, torch.Generator().manual_seed(0))
    assert abs(s.log().mean().item() + 1.2) < 0.02 and abs(s.log().std().item() - 1.2) < 0.02


def test_masked_mean_counts_only_masked_tokens():
    err = torch.ones(2, 3, 2, 2, 2)
    err[:, :, 1] = 100.0
    mask = torch.zeros(2, 2, 2, 2)
    mask[:, 0] = 1
    assert masked_mean(err, mask).item() == pytest.approx(1.0)
    assert masked_mean(err, None).item() == pytest.approx(50.5)


def _fit(objective, steps=200):
    """Fit a tiny DiT to a fixed batch of 4 synthetic shape images (structured data: the noise is
    recognisable at every level, unlike for Gaussian data)."""
    torch.manual_seed(0)
    net = dit_config("tiny", in_channels=3, context_dim=None, patch_size=(1, 2, 2)).build()
    spec = ShapeClipSpec(num_frames=1, height=16, width=16)
    x0 = torch.stack([frames_to_tensor(make_clip(spec, 0, i).frames) for i in range(4)])
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)

    def eval_loss():
        gen = torch.Generator().manual_seed(123)
        with torch.no_grad():
            return sum(objective.training_loss(net, x0, {}, generator=gen)[0].item() for _ in range(16)) / 16

    before = eval_loss()
    for _ in range(steps):
        loss, _ = objective.training_loss(net, x0, {}, generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, eval_loss()


def test_edm_loss_halves_on_a_fixed_batch_in_200_steps():
    before, after = _fit(EDM())
    assert after < 0.5 * before, (before, after)


def test_edm_x0_prediction_loss_halves_on_a_fixed_batch():
    before, after = _fit(EDM(prediction="x0"))
    assert after < 0.5 * before, (before, after)


def test_flow_matching_loss_drops_on_a_fixed_batch():
    before, after = _fit(FlowMatching(shift=1.0))
    assert after < 0.5 * before, (before, after)


def _gaussian_denoiser(mu, s2):
    """The exact D(x; sigma) = E[x0 | x] for x0 ~ N(mu, s2) elementwise."""
    return lambda x, sigma: mu + s2 / (s2 + sigma.view(-1, 1) ** 2) * (x - mu)


@pytest.mark.parametrize("sampler, steps, tol", [("heun", 32, 0.03), ("euler", 256, 0.06)])
def test_sampler_with_exact_denoiser_reproduces_gaussian(sampler, steps, tol):
    mu, s2 = 1.5, 0.25
    g = torch.Generator().manual_seed(0)
    sigmas = samplers.karras_sigmas(steps, 0.002, 80.0)
    x = torch.randn(20_000, 1, generator=g) * 80.0
    out = getattr(samplers, sampler)(_gaussian_denoiser(mu, s2), x, sigmas)
    assert abs(out.mean().item() - mu) < tol
    assert abs(out.var().item() - s2) / s2 < 2 * tol


def test_heun_is_second_order():
    """Halving the step count grows Heun's error ~4x; Euler's ~2x."""
    mu, s2 = 0.0, 0.25
    x = torch.linspace(-3, 3, 101)[:, None] * 80.0
    exact = samplers.heun(_gaussian_denoiser(mu, s2), x, samplers.karras_sigmas(1024, 0.002, 80.0))

    def err(fn, n):
        return (fn(_gaussian_denoiser(mu, s2), x, samplers.karras_sigmas(n, 0.002, 80.0)) - exact).abs().max().item()

    assert err(samplers.heun, 16) / err(samplers.heun, 32) > 3.0
    assert err(samplers.euler, 32) / err(samplers.euler, 64) < 2.5


def test_karras_schedule_endpoints():
    s = samplers.karras_sigmas(10, 0.002, 80.0)
    assert s.shape == (11,) and s[0] == pytest.approx(80.0) and s[-2] == pytest.approx(0.002) and s[-1] == 0
    assert (s[:-1] > s[1:]).all()


def test_flow_matching_euler_transports_to_gaussian():
    mu, s2 = -1.0, 0.09
    fm = FlowMatching()

    class ExactVelocity(torch.nn.Module):  # v(x, t) = E[n - x0 | x_t] for x0 ~ N(mu, s2)
        def forward(self, x, t, **cond):
            tb = t.view(-1, 1)
            var = (1 - tb) ** 2 * s2 + tb**2
            x0_hat = mu + (1 - tb) * s2 / var * (x - (1 - tb) * mu)
            return (x - x0_hat) / tb.clamp_min(1e-4)

    out = fm.sample(ExactVelocity(), (20_000, 1), {"context": torch.zeros(20_000, 1)}, num_steps=200,
                    generator=torch.Generator().manual_seed(0))
    assert abs(out.mean().item() - mu) < 0.03 and abs(out.var().item() - s2) < 0.02


def test_cfg_combines_conditional_and_unconditional():
    def fn(x, t, cond):
        return x * 0 + cond["class_labels"].float().view(-1, 1)

    cond, uncond = {"class_labels": torch.tensor([3, 5])}, {"class_labels": torch.tensor([1, 1])}
    out = guided(fn, cond, uncond, 2.0)(torch.zeros(2, 1), torch.ones(2))
    assert torch.equal(out, torch.tensor([[1 + 2 * 2.0], [1 + 2 * 4.0]]))
    assert torch.equal(guided(fn, cond, uncond, 1.0)(torch.zeros(2, 1), torch.ones(2)), torch.tensor([[3.0], [5.0]]))


def test_condition_dropout_rate_and_null():
    ctx = torch.randn(10_000, 3, 4)
    cond = {"context": ctx, "context_mask": torch.ones(10_000, 3, dtype=torch.bool),
            "class_labels": torch.zeros(10_000, dtype=torch.long)}
    out = drop_condition(cond, 0.2, torch.Generator().manual_seed(0), num_classes=7)
    dropped = ~out["context_mask"].any(1)
    assert abs(dropped.float().mean().item() - 0.2) < 0.02
    assert (out["context"][dropped] == 0).all() and torch.equal(out["context"][~dropped], ctx[~dropped])
    assert (out["class_labels"][dropped] == 7).all()
    assert (null_condition(cond, 7)["class_labels"] == 7).all()
