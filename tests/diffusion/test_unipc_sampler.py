"""The flow-matching UniPC sampler (``samplers.flow_unipc``) follows diffusers' UniPCMultistepScheduler
(flow prediction, flow sigmas, bh2, order 2, lower-order final step) driven step by step with the same tiny
random Wan model and noise: the same network inputs at every step and the same final latents."""

import pytest
import torch

from nemo_vfm.diffusion import samplers

diffusers = pytest.importorskip("diffusers")


def _model():
    from nemo_vfm.models.wan.model import WanConfig

    torch.manual_seed(0)
    net = WanConfig(num_layers=2, hidden_size=32, num_heads=2, ffn_size=48, in_channels=4, out_channels=4,
                    context_dim=8, freq_dim=16, text_len=6).build().eval()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ctx = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    return lambda x, t: net(x, t, ctx)


def _diffusers(velocity, noise, steps, shift):
    sched = diffusers.UniPCMultistepScheduler(
        num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift,
        solver_order=2, solver_type="bh2", predict_x0=True, lower_order_final=True, final_sigmas_type="zero")
    sched.set_timesteps(steps)
    x, inputs = noise.clone(), []
    for t in sched.timesteps:
        inputs.append((x.clone(), float(t)))
        v = velocity(x, (t.double() / 1000).float().expand(x.shape[0]))
        x = sched.step(v, t, x, return_dict=False)[0]
    return x, inputs


@pytest.mark.parametrize("steps, shift", [(10, 5.0), (6, 3.0), (2, 5.0), (1, 1.0)])
def test_flow_unipc_matches_diffusers_step_by_step(steps, shift):
    velocity = _model()
    noise = torch.randn(2, 4, 2, 4, 4, generator=torch.Generator().manual_seed(2))
    ref, ref_inputs = _diffusers(velocity, noise, steps, shift)
    sigmas, times = samplers.flow_unipc_schedule(steps, shift)
    ours_inputs = []

    def recorded(x, t):
        ours_inputs.append((x.clone(), float(t[0]) * 1000))
        return velocity(x, t)

    out = samplers.flow_unipc(recorded, noise.clone(), sigmas, times)
    assert len(ours_inputs) == len(ref_inputs) == steps
    for (x, t), (x_ref, t_ref) in zip(ours_inputs, ref_inputs):
        assert t == pytest.approx(t_ref, abs=1e-3)  # integer timesteps, as diffusers feeds Wan
        assert (x - x_ref).abs().max() <= 1e-6  # measured: bit-identical on the CPU
    assert (out - ref).abs().max() <= 1e-6
    assert not torch.allclose(out, noise)


def test_schedule_and_order_checks():
    sigmas, times = samplers.flow_unipc_schedule(4, 5.0)
    assert sigmas.dtype == torch.float32 and sigmas.shape == (5,) and times.shape == (4,)
    assert sigmas[-1] == 0 and 1 - 1e-5 < sigmas[0] < 1 and torch.all(sigmas[1:] < sigmas[:-1])
    assert times[0] == 0.999 and torch.all(times * 1000 == torch.floor(times * 1000 + 1e-3))
    with pytest.raises(ValueError, match="num_steps"):
        samplers.flow_unipc_schedule(0, 5.0)
    with pytest.raises(ValueError, match="order 1 or 2"):
        samplers.flow_unipc(lambda x, t: x, torch.zeros(1, 1), sigmas, times, order=3)
