"""DMD2's objective (nemo_vfm.diffusion.distillation) against direct computations on tiny networks: the DMD gradient,
the critic's loss, backward simulation, guidance folding, the update ratio and the input checks."""

import copy

import pytest
import torch
from torch import nn

from nemo_vfm.diffusion.conditioning import null_condition
from nemo_vfm.diffusion.distillation import DMD2, add_noise, default_levels, fold_guidance, predict_x0
from nemo_vfm.diffusion.edm import EDM
from nemo_vfm.diffusion.first_frame import FirstFrameFlowMatching
from nemo_vfm.diffusion.flow_matching import FlowMatching

B, C, T, H, W, L, D = 2, 3, 2, 4, 4, 5, 6


class TinyNet(nn.Module):
    """``net(x (B, C, T, H, W), t (B,), context (B, L, D), context_mask) -> (B, C, T, H, W)``; the text scales the
    output so that guidance matters."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.proj = nn.Conv3d(C, C, 1)
        self.time = nn.Linear(1, C)
        self.text = nn.Linear(D, C)

    def forward(self, x, t, context=None, context_mask=None):
        time = self.time(t.to(self.time.weight.dtype)[:, None])[:, :, None, None, None]
        text = torch.tanh(self.text(context).mean(1))[:, :, None, None, None]
        return torch.tanh(self.proj(x)) * (1 + text) + time


def nets():
    teacher = TinyNet(0).requires_grad_(False)
    critic = copy.deepcopy(teacher).requires_grad_(True)
    with torch.no_grad():
        for p in critic.parameters():  # the critic has moved away from the teacher
            p.add_(0.1 * torch.randn_like(p))
    student = TinyNet(1)
    return teacher, critic, student


def conds():
    g = torch.Generator().manual_seed(11)
    cond = {"context": torch.randn(B, L, D, generator=g), "context_mask": torch.ones(B, L, dtype=torch.bool)}
    return cond, null_condition(cond)


def objectives():
    return [FlowMatching(shift=3.0), EDM(p_mean=0.0, p_std=1.0)]


def x0_by_hand(obj, net, x, level, cond):
    """Clean-latent prediction from the objectives' formulas, written out."""
    lv = level[:, None, None, None, None]
    if isinstance(obj, FlowMatching):
        return x - lv * net(x, level, **cond)
    sd2 = obj.sigma_data ** 2
    c_skip, c_out, c_in = sd2 / (lv**2 + sd2), lv * obj.sigma_data / (lv**2 + sd2).sqrt(), 1 / (lv**2 + sd2).sqrt()
    return c_skip * x + c_out * net(c_in * x, level.log() / 4, **cond)


def noised_by_hand(obj, x0, n, level):
    lv = level[:, None, None, None, None]
    return (1 - lv) * x0 + lv * n if isinstance(obj, FlowMatching) else x0 + lv * n


def level_by_hand(obj, u):
    if isinstance(obj, FlowMatching):
        return obj.shift * u / (1 + (obj.shift - 1) * u)
    a, b = obj.sigma_min ** (1 / 7), obj.sigma_max ** (1 / 7)
    return (a + u * (b - a)) ** 7


@pytest.mark.parametrize("obj", objectives(), ids=["flow", "edm"])
def test_dmd_gradient_is_its_definition(obj):
    """d loss / d x0 (autograd) * numel == (fake - real) / mean|x0 - real| computed directly, per sample; the loss
    reaches only the student's parameters."""
    teacher, critic, student = nets()
    cond, uncond = conds()
    dmd = DMD2(objective=obj, teacher_guidance=3.0)
    noise = torch.randn(B, C, T, H, W, generator=torch.Generator().manual_seed(2))
    x0 = dmd.generate(student, noise, cond, 2, torch.Generator().manual_seed(3)).detach().requires_grad_(True)
    loss, logs = dmd.generator_loss(x0, teacher, critic, cond, uncond, torch.Generator().manual_seed(5))
    (autograd,) = torch.autograd.grad(loss, x0)

    g = torch.Generator().manual_seed(5)  # the documented draws: one level per sample, then the noise
    level = level_by_hand(obj, 0.02 + 0.96 * torch.rand(B, generator=g))
    n = torch.randn(x0.shape, generator=g)
    with torch.no_grad():
        x_t = noised_by_hand(obj, x0, n, level)
        pc, pu = x0_by_hand(obj, teacher, x_t, level, cond), x0_by_hand(obj, teacher, x_t, level, uncond)
        real = pu + 3.0 * (pc - pu)
        fake = x0_by_hand(obj, critic, x_t, level, cond)
        normaliser = (x0 - real).abs().mean(dim=(1, 2, 3, 4), keepdim=True)
        expected = (fake - real) / normaliser
    assert expected.abs().max() > 1e-3  # the critic differs from the teacher: a non-trivial gradient
    torch.testing.assert_close(autograd * x0.numel(), expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(loss, 0.5 * (expected**2).mean(), rtol=1e-4, atol=1e-6)
    assert set(logs) == {"dmd_loss", "dmd_level_mean", "dmd_normaliser_mean", "dmd_grad_abs_mean"}

    x0 = dmd.generate(student, noise, cond, 2, torch.Generator().manual_seed(3))  # with the student's graph
    dmd.generator_loss(x0, teacher, critic, cond, uncond, torch.Generator().manual_seed(5))[0].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    assert all(p.grad is None for p in [*teacher.parameters(), *critic.parameters()])


@pytest.mark.parametrize("obj", objectives(), ids=["flow", "edm"])
def test_critic_loss_is_the_teacher_objectives_loss_on_student_samples(obj):
    teacher, critic, student = nets()
    cond, _ = conds()
    dmd = DMD2(objective=obj)
    noise = torch.randn(B, C, T, H, W, generator=torch.Generator().manual_seed(2))
    x0 = dmd.generate(student, noise, cond, 1, torch.Generator().manual_seed(3))  # carries the student's graph
    fresh = copy.deepcopy(teacher)  # a critic just initialised from the teacher scores as the teacher does
    loss, logs = dmd.critic_loss(fresh, x0, cond, generator=torch.Generator().manual_seed(4))
    ref, _ = obj.training_loss(teacher, x0.detach(), cond, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(loss, ref)
    assert set(logs) == set(obj.LOG_NAMES)

    loss = dmd.critic_loss(critic, x0, cond, generator=torch.Generator().manual_seed(4))[0]
    if isinstance(obj, FlowMatching):  # the velocity loss written out, with the objective's draws (time, noise)
        g = torch.Generator().manual_seed(4)
        t = obj.sample_time(B, g)
        n = torch.randn(x0.shape, generator=g)
        xt = noised_by_hand(obj, x0.detach(), n, t)
        torch.testing.assert_close(loss, ((critic(xt, t, **cond) - (n - x0.detach())) ** 2).mean())
    loss.backward()  # trains the critic only: the student's samples are detached
    assert all(p.grad is not None for p in critic.parameters())
    assert all(p.grad is None for p in student.parameters())


@pytest.mark.parametrize("obj", objectives(), ids=["flow", "edm"])
def test_backward_simulation_is_the_student_sampler_run_by_hand(obj):
    _, _, student = nets()
    cond, _ = conds()
    dmd = DMD2(objective=obj, num_steps=4)
    levels = dmd.schedule()
    noise = torch.randn(B, C, T, H, W, generator=torch.Generator().manual_seed(2))

    g = torch.Generator().manual_seed(7)  # K steps by hand: predict x0, re-noise with fresh noise to the next level
    inputs, preds = [], []
    x = noise * levels[0] if isinstance(obj, EDM) else noise  # flow matching starts at t = 1: pure noise
    with torch.no_grad():
        for k in range(4):
            inputs.append(x)
            level = levels[k].expand(B)
            preds.append(x0_by_hand(obj, student, x, level, cond))
            if k < 3:
                x = noised_by_hand(obj, preds[-1], torch.randn(x.shape, generator=g), levels[k + 1].expand(B))

    for k in range(4):
        x_k = dmd.simulate(student, noise, cond, k, torch.Generator().manual_seed(7))
        torch.testing.assert_close(x_k, inputs[k])
        with torch.no_grad():
            torch.testing.assert_close(dmd.generate(student, noise, cond, k, torch.Generator().manual_seed(7)), preds[k])
    sample = dmd.sample(student, noise, cond, torch.Generator().manual_seed(7))
    torch.testing.assert_close(sample, preds[-1])  # training's last step sees exactly what inference does


@pytest.mark.parametrize("obj", objectives(), ids=["flow", "edm"])
def test_guidance_folding(obj):
    teacher, _, _ = nets()
    cond, uncond = conds()
    x = torch.randn(B, C, T, H, W, generator=torch.Generator().manual_seed(1))
    level = torch.tensor([0.7, 0.3]) if isinstance(obj, FlowMatching) else torch.tensor([5.0, 0.4])
    with torch.no_grad():
        pc = predict_x0(obj, teacher, x, level, cond)
        pu = predict_x0(obj, teacher, x, level, uncond)
        s = 2.5  # DMD2 / Self-Forcing's form: cond + s (cond - uncond), i.e. the sampler's scale w = 1 + s
        torch.testing.assert_close(fold_guidance(obj, teacher, cond, uncond, 1 + s)(x, level), pc + s * (pc - pu))
        calls = []
        teacher.register_forward_hook(lambda *a: calls.append(1))
        torch.testing.assert_close(fold_guidance(obj, teacher, cond, uncond, 1.0)(x, level), pc)
        assert len(calls) == 1  # guidance 1: the conditional pass only


def test_update_ratio_and_step_choice():
    dmd = DMD2(objective=FlowMatching(), generator_update_every=3)
    assert [dmd.updates_generator(i) for i in range(7)] == [True, False, False, True, False, False, True]
    assert all(DMD2(objective=FlowMatching(), generator_update_every=1).updates_generator(i) for i in range(4))
    with pytest.raises(ValueError, match="step"):
        dmd.updates_generator(-1)
    picks = [dmd.pick_step(torch.Generator().manual_seed(s)) for s in range(40)]
    assert set(picks) == {0, 1, 2, 3}
    assert picks == [dmd.pick_step(torch.Generator().manual_seed(s)) for s in range(40)]  # same seed, same k


def test_schedules():
    assert default_levels(FlowMatching(), 4) == (1.0, 0.75, 0.5, 0.25)
    fm = FlowMatching(shift=5.0)
    assert DMD2(objective=fm).schedule().tolist() == pytest.approx(
        fm.shift_time(torch.tensor([1.0, 0.75, 0.5, 0.25])).tolist())
    edm = EDM()
    sig = DMD2(objective=edm, num_steps=3).schedule()
    assert sig[0] == pytest.approx(edm.sigma_max) and sig[-1] == pytest.approx(edm.sigma_min, rel=1e-4)
    assert DMD2(objective=fm, num_steps=1).schedule().tolist() == [1.0]
    assert DMD2(objective=fm, num_steps=2, levels=[1.0, 0.4]).schedule().tolist() == pytest.approx([1.0, 0.4])
    dmd = DMD2(objective=fm)
    lv = dmd.draw_level(1000, torch.Generator().manual_seed(0))
    assert lv.min() >= fm.shift_time(torch.tensor(0.02)) and lv.max() <= fm.shift_time(torch.tensor(0.98))


@pytest.mark.parametrize("kw, err, match", [
    (dict(num_steps=0), ValueError, "num_steps must be >= 1"),
    (dict(num_steps=3, levels=(1.0, 0.5, 0.5)), ValueError, "strictly decreasing"),
    (dict(num_steps=3, levels=(0.5, 0.7, 0.2)), ValueError, "strictly decreasing"),
    (dict(num_steps=2, levels=(1.0, 0.5, 0.2)), ValueError, "one noise level per student step"),
    (dict(num_steps=2, levels=(2.0, 0.5)), ValueError, r"\(0, 1\]"),
    (dict(teacher_guidance=0.5), ValueError, "teacher_guidance"),
    (dict(level_range=(0.9, 0.1)), ValueError, "level_range"),
    (dict(generator_update_every=0), ValueError, "generator_update_every"),
    (dict(gan_weight=-1.0), ValueError, "gan_weight"),
    (dict(gan_critic_weight=-1.0), ValueError, "gan_critic_weight"),
    (dict(gan_critic_weight=0.1), ValueError, "GAN term, which is off"),
    (dict(gan_feature_block=3), ValueError, "GAN term, which is off"),
    (dict(gan_weight=0.1, gan_critic_weight=0.0), ValueError, "untrained discriminator"),
])
def test_bad_settings_raise_naming_the_fix(kw, err, match):
    with pytest.raises(err, match=match):
        DMD2(objective=FlowMatching(), **kw)


def test_bad_objectives_and_steps():
    with pytest.raises(ValueError, match="FlowMatching or EDM"):
        DMD2(objective=object())
    with pytest.raises(NotImplementedError, match="FirstFrameFlowMatching"):
        DMD2(objective=FirstFrameFlowMatching(patch_size=(1, 2, 2)))
    with pytest.raises(ValueError, match="must be > 0"):
        DMD2(objective=EDM(), num_steps=2, levels=(1.0, 0.0))
    _, _, student = nets()
    with pytest.raises(ValueError, match=r"step must be in \[0, 4\)"):
        DMD2(objective=FlowMatching()).simulate(student, torch.randn(B, C, T, H, W), conds()[0], 4)


def test_settings_without_effect_warn():
    with pytest.warns(UserWarning, match="rho has no effect"):
        DMD2(objective=FlowMatching(), rho=5.0)


def test_guidance_without_uncond_warns():
    teacher, critic, _ = nets()
    cond, _ = conds()
    x0 = torch.randn(B, C, T, H, W)
    with pytest.warns(UserWarning, match="no effect"):
        DMD2(objective=FlowMatching(), teacher_guidance=4.0).generator_loss(x0, teacher, critic, cond, None)


def test_one_distillation_step_on_the_project_dit():
    """The three networks as the project builds them (a tiny DiT): a generator update and a critic update run, and
    each reaches only its own network."""
    from nemo_vfm.models.dit.flavors import dit_config

    cfg = dit_config("tiny", in_channels=4, context_dim=D)
    torch.manual_seed(0)
    teacher = cfg.build().requires_grad_(False)
    with torch.no_grad():
        for p in teacher.parameters():  # adaLN-Zero starts at zero: give the blocks something to compute
            p.add_(0.05 * torch.randn_like(p))
    critic, student = copy.deepcopy(teacher).requires_grad_(True), copy.deepcopy(teacher).requires_grad_(True)
    cond, uncond = conds()
    dmd = DMD2(objective=FlowMatching(shift=3.0), num_steps=3)
    noise = torch.randn(B, 4, 2, 8, 8, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    x0 = dmd.generate(student, noise, cond, dmd.pick_step(torch.Generator().manual_seed(2)), g)
    loss, logs = dmd.generator_loss(x0, teacher, critic, cond, uncond, g)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(v) for v in logs.values())
    assert any(p.grad is not None for p in student.parameters())
    assert all(p.grad is None for p in critic.parameters())
    closs, _ = dmd.critic_loss(critic, x0, cond, generator=g)
    closs.backward()
    assert torch.isfinite(closs) and any(p.grad is not None for p in critic.parameters())
    assert dmd.sample(student, noise, cond, g).shape == noise.shape


def test_the_documented_step_loop():
    """docs/diffusion.md's step, with optimizers: the critic changes every step, the student only on the steps
    updates_generator picks, the teacher never."""
    teacher, critic, student = nets()
    cond, uncond = conds()
    dmd = DMD2(objective=FlowMatching(shift=3.0), generator_update_every=2)
    opt_s, opt_c = torch.optim.SGD(student.parameters(), lr=0.1), torch.optim.SGD(critic.parameters(), lr=0.1)
    shared, g = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    frozen = [p.clone() for p in teacher.parameters()]
    for step in range(4):
        before_s, before_c = [p.clone() for p in student.parameters()], [p.clone() for p in critic.parameters()]
        noise = torch.randn(B, C, T, H, W, generator=g)
        k = dmd.pick_step(shared)
        train_student = dmd.updates_generator(step)
        with torch.set_grad_enabled(train_student):
            x0 = dmd.generate(student, noise, cond, k, g)
        if train_student:
            opt_s.zero_grad()
            dmd.generator_loss(x0, teacher, critic, cond, uncond, g)[0].backward()
            opt_s.step()
        opt_c.zero_grad()
        dmd.critic_loss(critic, x0, cond, generator=g)[0].backward()
        opt_c.step()
        moved_s = any(not torch.equal(a, b) for a, b in zip(before_s, student.parameters()))
        assert moved_s == train_student, step
        assert any(not torch.equal(a, b) for a, b in zip(before_c, critic.parameters())), step
    assert all(torch.equal(a, b) for a, b in zip(frozen, teacher.parameters()))


class _GaussianTeacher(nn.Module):
    """The exact flow-matching velocity of data ``N(mu, s^2)`` per element: ``E[x0 | x_t]`` is affine in ``x_t``."""

    mu, s = 2.0, 0.5

    def forward(self, x, t, **_):
        tb, a = t.view(-1, 1, 1, 1, 1), 1 - t.view(-1, 1, 1, 1, 1)
        x0 = self.mu + a * self.s**2 / (a**2 * self.s**2 + tb**2) * (x - a * self.mu)
        return (x - x0) / tb


class _AffineNet(nn.Module):
    """``v = p(t) x + q(t)``: exact for Gaussian data, so the critic can follow a Gaussian student."""

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, 32), nn.SiLU(), nn.Linear(32, 2))

    def forward(self, x, t, **_):
        p, q = self.mlp(t.view(-1, 1)).unbind(1)
        return p.view(-1, 1, 1, 1, 1) * x + q.view(-1, 1, 1, 1, 1)


def test_the_student_moves_to_the_teachers_distribution():
    """A one-step student starting near N(0, 1) is pulled to the analytic teacher's data mean by DMD2 alone (no data):
    the gradient's sign and the critic's role end to end."""
    torch.manual_seed(0)
    teacher, critic, student = _GaussianTeacher(), _AffineNet(), _AffineNet()
    dmd = DMD2(objective=FlowMatching(time_sampling="uniform"), num_steps=1, teacher_guidance=1.0,
               generator_update_every=3)
    opt_c, opt_s = torch.optim.Adam(critic.parameters(), lr=2e-2), torch.optim.Adam(student.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(1)
    probe = torch.randn(2048, 1, 1, 1, 4, generator=torch.Generator().manual_seed(9))
    assert abs(dmd.sample(student, probe, {}).mean()) < 0.5
    for step in range(400):
        train_student = dmd.updates_generator(step) and step >= 50  # the critic first follows the student
        with torch.set_grad_enabled(train_student):
            x0 = dmd.generate(student, torch.randn(128, 1, 1, 1, 4, generator=g), {}, 0, g)
        if train_student:
            opt_s.zero_grad()
            dmd.generator_loss(x0, teacher, critic, {}, None, g)[0].backward()
            opt_s.step()
        opt_c.zero_grad()
        dmd.critic_loss(critic, x0, {}, generator=g)[0].backward()
        opt_c.step()
    assert abs(dmd.sample(student, probe, {}).mean() - _GaussianTeacher.mu) < 0.2


class TinyDiscriminator(nn.Module):
    """``D(x_t (B, C, T, H, W), level (B,)) -> (B,)``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.proj = nn.Linear(C, 1)
        self.time = nn.Linear(1, 1)

    def forward(self, x_t, level):
        return self.proj(torch.tanh(x_t).mean((2, 3, 4))).squeeze(-1) + self.time(level[:, None]).squeeze(-1)


@pytest.mark.parametrize("obj", [FlowMatching(shift=3.0), EDM()], ids=["flow", "edm"])
def test_gan_generator_term_reaches_the_samples_only(obj):
    dmd = DMD2(objective=obj, gan_weight=0.005)
    disc = TinyDiscriminator()
    x0 = torch.randn(B, C, T, H, W, requires_grad=True)
    loss, logs = dmd.gan_generator_loss(x0, disc, torch.Generator().manual_seed(1))
    loss.backward()
    assert all(p.grad is None for p in disc.parameters())  # the discriminator's weights take nothing
    g = torch.Generator().manual_seed(1)  # by hand: the same draws, the loss's own gradient
    x = x0.detach().requires_grad_(True)
    level = dmd.draw_level(B, g)
    noise = torch.randn(x.shape, generator=g)
    direct = 0.005 * torch.nn.functional.softplus(-disc(add_noise(obj, x, noise, level), level)).mean()
    direct.backward()
    torch.testing.assert_close(loss.detach(), direct.detach())
    torch.testing.assert_close(logs["gan_generator_loss"], direct.detach())
    torch.testing.assert_close(x0.grad, x.grad)


def test_gan_critic_term_is_the_classification_loss():
    obj = FlowMatching(shift=3.0)
    dmd = DMD2(objective=obj, gan_weight=0.005, gan_critic_weight=0.02)
    disc = TinyDiscriminator()
    real, fake = torch.randn(B, C, T, H, W), torch.randn(B, C, T, H, W) * 2
    loss, logs = dmd.gan_critic_loss(disc, real, fake, torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(2)
    noised = []
    for x in (real, fake):
        level = dmd.draw_level(B, g)
        noised.append((add_noise(obj, x, torch.randn(x.shape, generator=g), level), level))
    sp = torch.nn.functional.softplus
    direct = 0.02 * (sp(-disc(*noised[0])).mean() + sp(disc(*noised[1])).mean())
    torch.testing.assert_close(loss, direct)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in disc.parameters())
    assert set(logs) == {"gan_loss", "gan_real_logit", "gan_fake_logit"}
