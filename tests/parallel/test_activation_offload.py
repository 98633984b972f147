"""Activation offloading (``nemo_vfm.parallel.activation_offload``) on a tiny Wan, on CPU with the host as the "offload"
target (each packed tensor is really copied): the tensors the blocks save go through the host and come back,
parameters and small tensors stay, the loss and every gradient are bitwise those of the plain path, also under
activation checkpointing; the strategy's wiring skips it on a CPU device with a warning."""

import copy

import pytest
import torch

from nemo_vfm.models.wan.model import WanConfig
from nemo_vfm.parallel.activation_checkpoint import apply_activation_checkpointing
from nemo_vfm.parallel.activation_offload import (
    ActivationOffloader,
    apply_saved_tensor_hooks,
    install_offload,
)
from nemo_vfm.parallel.grads import clean_name


def tiny_wan(layers: int = 3):
    torch.manual_seed(0)
    cfg = WanConfig(num_layers=layers, hidden_size=32, num_heads=2, ffn_size=48, in_channels=4, out_channels=4,
                    context_dim=16, freq_dim=16, text_len=6)
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():  # away from the zero init: every gradient is informative
            p.add_(0.1 * torch.randn_like(p))
    return net


def batch():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(2, 4, 2, 4, 4, generator=g), torch.rand(2, generator=g) * 1000,
            torch.randn(2, 6, 16, generator=g))


def loss_and_grads(net):
    x, t, ctx = batch()
    loss = net(x, t, context=ctx).float().pow(2).mean()
    loss.backward()
    return loss.detach(), {clean_name(n): p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


class Recording(ActivationOffloader):
    """Remembers the storages of the tensors it parked, to check that no parameter went."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.storages = set()

    def pack(self, t):
        out = super().pack(t)
        if out is not t:
            self.storages.add(t.untyped_storage().data_ptr())
        return out


def assert_same(ref, got):
    assert torch.equal(ref[0], got[0]), (ref[0], got[0])
    assert ref[1].keys() == got[1].keys()
    for n in ref[1]:
        assert torch.equal(ref[1][n], got[1][n]), n


def test_saved_activations_go_through_the_host_and_results_are_bitwise_equal():
    net = tiny_wan()
    ref = loss_and_grads(copy.deepcopy(net))
    off = Recording("cpu", min_bytes=0)
    apply_saved_tensor_hooks(net.blocks, off)
    got = loss_and_grads(net)
    assert_same(ref, got)
    assert off.packed > 20 and off.unpacked == off.packed  # every parked tensor came back once
    params = {p.untyped_storage().data_ptr() for p in net.parameters()}
    assert not off.storages & params  # weights (and their transposed views) stay where they are


def test_small_tensors_stay_on_the_device():
    net = tiny_wan()
    every, sized = Recording("cpu", min_bytes=0), Recording("cpu", min_bytes=1024)  # tokens (2, 8, 32): 2 KiB
    a, b = copy.deepcopy(net), copy.deepcopy(net)
    apply_saved_tensor_hooks(a.blocks, every)
    apply_saved_tensor_hooks(b.blocks, sized)
    ref = loss_and_grads(net)
    assert_same(ref, loss_and_grads(a))
    assert_same(ref, loss_and_grads(b))
    assert 0 < sized.packed < every.packed  # (2, 32) modulation rows (256 B) stayed


@pytest.mark.parametrize("mode", ["full", "selective", "save_attention"])
def test_composes_with_activation_checkpointing(mode):
    """The hooks sit outside the checkpoint wrapper. A checkpointed block saves its inputs (torch's non-reentrant
    checkpoint keeps them as saved tensors): those are offloaded, the recomputation in backward is untouched.
    ``selective`` checkpoints every second block; the others offload all they save."""
    net = tiny_wan()
    ref = loss_and_grads(copy.deepcopy(net))
    apply_activation_checkpointing(net.blocks, mode, every=2)
    inputs = set()
    for block in net.blocks:
        if hasattr(block, "_checkpoint_wrapped_module"):
            block.register_forward_pre_hook(lambda m, args, kwargs: inputs.update(
                t.untyped_storage().data_ptr() for t in [*args, *kwargs.values()] if torch.is_tensor(t)),
                with_kwargs=True)
    off = Recording("cpu", min_bytes=0)
    apply_saved_tensor_hooks(net.blocks, off)
    assert_same(ref, loss_and_grads(net))
    assert off.packed > 0 and off.unpacked == off.packed
    if mode != "selective":  # every block checkpointed: only block inputs went to the host
        assert off.storages <= inputs, (len(off.storages), len(inputs))


def test_backward_prefetches_the_previous_block():
    net = tiny_wan()
    off = ActivationOffloader("cpu", min_bytes=0)
    prefetched = []
    real = off.prefetch
    off.prefetch = lambda block: (prefetched.append(block), real(block))
    apply_saved_tensor_hooks(net.blocks, off)
    loss_and_grads(net)
    firsts = list(dict.fromkeys(prefetched))  # the order in which each block was first asked for
    assert firsts[:3] == [1, 0, -1]  # backward goes block 2 -> 1 -> 0, each asking for the one before


def test_strategy_wiring_is_a_warned_no_op_on_cpu():
    net = tiny_wan()
    with pytest.warns(UserWarning, match="no effect on a CPU device"):
        host = install_offload(net, "cpu", activation_offload=True)
    assert host == []
    assert all(not b._forward_pre_hooks for b in net.blocks)  # nothing installed: the plain path


def test_expandable_segments_is_set_once_unless_the_user_configured_the_allocator(monkeypatch):
    """Offloading on CUDA lets the allocator grow segments (fragmentation ran a 24 GiB Wan-14B run out of memory);
    a ``PYTORCH_CUDA_ALLOC_CONF`` naming ``expandable_segments`` is the user's choice and stays."""
    from nemo_vfm.parallel import activation_offload

    calls = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", calls.append, raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    activation_offload.expandable_segments()
    assert calls == ["expandable_segments:True"]
    for conf in ("expandable_segments:False", "backend:cudaMallocAsync"):
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", conf)
        activation_offload.expandable_segments()
    assert calls == ["expandable_segments:True"]
