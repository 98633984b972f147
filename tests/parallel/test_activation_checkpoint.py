"""Activation checkpointing modes give the gradients of no checkpointing; ``"save_attention"`` runs each
self-attention kernel once per training step (its output is kept) and recomputes the short-text cross-attention."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nemo_vfm.models.common.lora import LoRAConfig, apply_lora
from nemo_vfm.models.wan.flavors import wan_config
from nemo_vfm.parallel.activation_checkpoint import ATTENTION_OPS, MODES, apply_activation_checkpointing


class _AttentionCalls(TorchDispatchMode):
    """Records (queries, keys) of every fused attention kernel that runs."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in ATTENTION_OPS:
            self.calls.append((args[0].shape[-2], args[1].shape[-2]))
        return func(*args, **(kwargs or {}))


def _step(mode: str, lora: bool = False, count: int | None = None):
    """One forward + backward of a tiny Wan (32 video tokens, 16 text tokens): gradients by name and the
    attention kernels that ran."""
    torch.manual_seed(0)
    model = wan_config("tiny").build()
    if lora:
        apply_lora(model, LoRAConfig(rank=4, targets=("self_attn.q", "self_attn.v", "cross_attn.k", "ffn.0")))
        for name, p in model.named_parameters():
            if "lora_B" in name:  # non-zero B, so that every adapter gets a gradient through the block
                torch.nn.init.normal_(p, std=0.1)
    apply_activation_checkpointing(model.blocks, mode, count=count)
    g = torch.Generator().manual_seed(1)
    x, t, ctx = torch.randn(2, 4, 2, 8, 8, generator=g), torch.rand(2, generator=g), torch.randn(2, 5, 16, generator=g)
    with _AttentionCalls() as seen:
        model(x, t, ctx).square().mean().backward()
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()
             if p.requires_grad}
    return grads, seen.calls


@pytest.mark.parametrize("lora", [False, True], ids=["full-ft", "lora"])
@pytest.mark.parametrize("mode", [m for m in MODES if m != "none"])
def test_gradients_equal_no_checkpointing(mode, lora):
    ref, _ = _step("none", lora)
    got, _ = _step(mode, lora)
    assert got.keys() == ref.keys() and len(ref) > 0
    for name, g in ref.items():
        torch.testing.assert_close(got[name], g, rtol=0, atol=1e-6, msg=name)


def test_save_attention_skips_the_self_attention_recompute():
    counts = {}
    for mode in ("none", "full", "save_attention"):
        _, calls = _step(mode)
        counts[mode] = (sum(q == k for q, k in calls), sum(k < q for q, k in calls))  # (self, cross) kernels run
    blocks = 2
    assert counts["none"] == (blocks, blocks)
    assert counts["full"] == (2 * blocks, 2 * blocks)  # forward + recompute of both
    assert counts["save_attention"] == (blocks, 2 * blocks)  # self-attention kept, text cross-attention recomputed


@pytest.mark.parametrize("mode", ["full", "save_attention", "selective_op"])
def test_the_first_n_blocks_only(mode):
    """``count=1`` (``activation_checkpointing_blocks``): block 0 wrapped, block 1 left whole; the gradients of no
    checkpointing; under ``full`` only block 0's attention kernels run again."""
    ref, _ = _step("none")
    got, calls = _step(mode, count=1)
    for name, g in ref.items():
        torch.testing.assert_close(got[name], g, rtol=0, atol=1e-6, msg=name)
    if mode == "full":
        assert len(calls) == 2 * 2 + 2  # self + cross in both blocks, then block 0's two again
    model = wan_config("tiny").build()
    apply_activation_checkpointing(model.blocks, mode, count=1)
    assert [hasattr(b, "_checkpoint_wrapped_module") for b in model.blocks] == [True, False]


def test_a_count_no_mode_reads_or_past_the_blocks_is_refused():
    blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Identity(), torch.nn.Linear(2, 2)])
    for mode in ("none", "selective"):
        with pytest.raises(ValueError, match=f"not by '{mode}'"):
            apply_activation_checkpointing(blocks, mode, count=1)
    with pytest.raises(ValueError, match="holds 2 blocks; set at most 2"):  # the Identity is another rank's block
        apply_activation_checkpointing(blocks, "full", count=3)


def test_unknown_mode_names_the_choices():
    with pytest.raises(ValueError, match="save_attention"):
        apply_activation_checkpointing(torch.nn.ModuleList([torch.nn.Linear(2, 2)]), "attention")
