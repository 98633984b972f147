"""Activation offload and block swap on CUDA (side streams, pinned host memory, one device buffer per block): a tiny
LoRA Wan gives the plain path's loss and gradients on the GPU, over two steps, with and without activation
checkpointing, and the swapped weights are back in pinned host memory after a step (the CPU tests run the same
mechanics with the host as the device)."""

import copy

import pytest
import torch
from test_activation_offload import batch
from test_block_swap import lora_wan

from nemo_vfm.parallel.activation_checkpoint import apply_activation_checkpointing
from nemo_vfm.parallel.activation_offload import ActivationOffloader, apply_saved_tensor_hooks
from nemo_vfm.parallel.block_swap import BlockSwapper
from nemo_vfm.parallel.grads import clean_name

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _steps(net, n=2):
    """Loss and gradients of ``n`` forward/backward passes on the GPU (gradients cleared in between)."""
    x, t, ctx = (v.cuda() for v in batch())
    out = []
    for _ in range(n):
        net.zero_grad(set_to_none=True)
        loss = net(x, t, context=ctx).float().pow(2).mean()
        loss.backward()
        out.append((loss.item(), {clean_name(k): p.grad.cpu() for k, p in net.named_parameters() if p.grad is not None}))
    return out


@pytest.mark.parametrize("mode", ["none", "full", "save_attention"])
def test_offload_and_swap_on_cuda_equal_the_plain_path(mode):
    net = lora_wan()
    plain = copy.deepcopy(net).cuda()
    if mode != "none":
        apply_activation_checkpointing(plain.blocks, mode, every=2)
        apply_activation_checkpointing(net.blocks, mode, every=2)
    ref = _steps(plain)
    swap = BlockSwapper(net.blocks, 2, "cuda")
    with swap.kept_on_host():
        net.cuda()
    swap.install(net.blocks)
    offloader = ActivationOffloader("cuda", min_bytes=0)  # every saved activation of the tiny net goes to the host
    apply_saved_tensor_hooks(net.blocks, offloader, swap)
    got = _steps(net)
    for (ref_loss, ref_grads), (loss, grads) in zip(ref, got):
        assert loss == pytest.approx(ref_loss, rel=1e-6)
        assert grads.keys() == ref_grads.keys()
        bad = [k for k in ref_grads if not torch.allclose(grads[k], ref_grads[k], rtol=1e-5, atol=1e-7)]
        assert not bad, bad
    assert all(p.device.type == "cpu" and p.is_pinned() for p in swap.params(1))  # block 1: back on the host
    assert all(p.device.type == "cuda" for p in net.blocks[2].parameters())  # not swapped
