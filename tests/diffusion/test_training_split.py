"""The objectives' training step split in two (input, then loss from the output) gives what the one-call
``training_loss`` gave, and micro-batch shares of the loss add up to the batch loss (pipeline stages)."""


import pytest
import torch

from bench.equivalence import tiny_config
from nemo_vfm.diffusion.edm import EDM
from nemo_vfm.diffusion.flow_matching import FlowMatching

OBJECTIVES = {"edm": EDM(), "fm": FlowMatching(shift=3.0)}


def _reference_loss(objective, net, x0, cond, mask, g):
    """The one-call formulas, written out (as they were before the split)."""
    b = lambda v: v.reshape(-1, 1, 1, 1, 1)
    if isinstance(objective, EDM):
        sigma = objective.sample_sigma(x0.shape[0], g)
        x = x0 + torch.randn(x0.shape, generator=g) * b(sigma)
        c_skip, c_out, c_in, c_noise = objective.precondition(sigma)
        denoised = b(c_skip) * x + b(c_out) * net(x * b(c_in), c_noise, **cond)
        err = b(objective.loss_weight(sigma)) * (denoised - x0) ** 2
    else:
        t = objective.sample_time(x0.shape[0], g)
        noise = torch.randn(x0.shape, generator=g)
        err = (net((1 - b(t)) * x0 + b(t) * noise, t, **cond) - (noise - x0)) ** 2
    if mask is None:
        return err.mean()
    m = mask[:, None].expand_as(err)
    return (err * m).sum() / m.sum()


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    net = tiny_config().build()
    x0 = torch.randn(4, 4, 2, 4, 4)
    cond = {"context": torch.randn(4, 5, 32), "context_mask": torch.ones(4, 5, dtype=torch.bool)}
    mask = (torch.rand(4, 2, 4, 4) > 0.3).float()
    return net, x0, cond, mask


@pytest.mark.parametrize("name", OBJECTIVES)
@pytest.mark.parametrize("masked", [False, True])
def test_split_step_equals_the_one_call_loss(setup, name, masked):
    net, x0, cond, mask = setup
    obj, m = OBJECTIVES[name], (mask if masked else None)
    loss, logs = obj.training_loss(net, x0, cond, m, torch.Generator().manual_seed(3))
    ref = _reference_loss(obj, net, x0, cond, m, torch.Generator().manual_seed(3))
    assert torch.equal(loss, ref)
    inp = obj.training_input(x0, torch.Generator().manual_seed(3))
    again, logs2 = obj.loss_from_output(net(inp.x, inp.timesteps, **cond), inp, m)
    assert torch.equal(again, loss) and list(logs) == list(logs2) == list(obj.LOG_NAMES)


@pytest.mark.parametrize("name", OBJECTIVES)
@pytest.mark.parametrize("masked", [False, True])
def test_micro_batch_shares_add_up_to_the_batch_loss(setup, name, masked):
    net, x0, cond, mask = setup
    obj, m = OBJECTIVES[name], (mask if masked else None)
    inp = obj.training_input(x0, torch.Generator().manual_seed(4))
    out = net(inp.x, inp.timesteps, **cond)
    whole, _ = obj.loss_from_output(out, inp, m)
    parts = [obj.micro_batch_loss(out[idx], inp, m, idx) for idx in (torch.tensor([0, 1]), torch.tensor([2]),
                                                                        torch.tensor([3]))]
    assert torch.stack(parts).sum().item() == pytest.approx(whole.item(), rel=1e-6)
    grad_whole = torch.autograd.grad(whole, out)[0]
    grad_parts = torch.autograd.grad(torch.stack(parts).sum(), out)[0]
    torch.testing.assert_close(grad_parts, grad_whole, rtol=1e-5, atol=1e-9)
