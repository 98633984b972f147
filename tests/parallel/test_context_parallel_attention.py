"""Ring and all-to-all attention on 2 and 4 gloo processes match single-process attention (values and grads)."""

import torch
import torch.distributed as dist
from collective_log import logged_all_to_alls
from gloo_launcher import run_distributed


def _reference(q, k, v, seg):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    mask = None if seg is None else (seg[:, None, :, None] == seg[:, None, None, :])
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.backward(torch.ones_like(out) * torch.linspace(-1, 1, out.shape[2])[None, None, :, None])
    return out.detach(), q.grad, k.grad, v.grad


def _worker(rank, world, packed):
    from nemo_vfm.parallel import context_parallel as cpm

    g = torch.Generator().manual_seed(0)
    B, H, S, D = 2, 8, 16, 8  # 4 and 2 heads per rank on 2 and 4 processes
    q, k, v = (torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(3))
    seg = None
    if packed:  # two packed sequences of 10 and 6 tokens in sample 0, one of 16 in sample 1
        seg = torch.stack([cpm.segment_ids_from_cu_seqlens(torch.tensor([0, 10, 16])), torch.zeros(S, dtype=torch.long)])
    ref = _reference(q, k, v, seg)
    group = dist.group.WORLD
    errs = {}
    kinds = [("ring", "math"), ("a2a", None)] + ([] if packed else [("ring", "cpu_flash")])
    for kind, backend in kinds:
        dt = torch.float32 if backend == "cpu_flash" else torch.float64
        loc = [cpm.split_tokens(t.to(dt), 2, group).detach().requires_grad_(True) for t in (q, k, v)]
        seg_loc = None if seg is None else cpm.split_tokens(seg, 1, group)
        if kind == "ring":
            out = cpm.ring_attention(*loc, group, segment_ids=seg_loc, backend=backend)
        else:
            out = cpm.ulysses_attention(*loc, group, segment_ids=seg_loc)
        w = torch.linspace(-1, 1, S)[None, None, :, None].to(dt)
        (out * cpm.split_tokens(w, 2, group)).sum().backward()
        full = [cpm.gather_no_grad(t, 2, group) for t in (out.detach(), *(x.grad for x in loc))]
        errs[f"{kind}-{backend}"] = max((a.double() - b).abs().max().item() for a, b in zip(full, ref))
    return errs


def test_ring_and_a2a_match_single_process():
    for world in (2, 4):  # 4: the all-to-all's head and token blocks differ from their transpose
        errs = run_distributed(_worker, world, False)[0]
        assert errs["ring-math"] < 1e-10 and errs["a2a-None"] < 1e-10, (world, errs)
        assert errs["ring-cpu_flash"] < 1e-5, (world, errs)


def test_packed_thd_sequences_under_cp():
    errs = run_distributed(_worker, 2, True)[0]
    assert all(e < 1e-10 for e in errs.values()), errs


def test_head_groups_must_divide_a_ranks_heads_before_anything_is_built():
    """``context_parallel_a2a_chunks`` is checked against the heads of a CP rank in ``parallelize``, before any core
    is swapped or weight sharded (here no process group exists)."""
    from types import SimpleNamespace

    import pytest

    from nemo_vfm.models.dit.model import DiT, DiTConfig
    from nemo_vfm.models.families import family_spec
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.parallelize import parallelize

    cfg = DiTConfig(num_layers=1, hidden_size=64, num_heads=8, in_channels=4, context_dim=16)
    pmesh = SimpleNamespace(dims=ParallelDims(world_size=2, cp=2, cp_kind="a2a"))  # 4 heads a rank
    with pytest.raises(ValueError, match=r"context_parallel_a2a_chunks=3 must divide the 4 attention heads"):
        parallelize(DiT(cfg), pmesh, spec=family_spec(cfg), context_parallel_a2a_chunks=3)


def _schedule_worker(rank, world):
    from nemo_vfm.parallel import context_parallel as cpm

    events = []

    def attend(q, k, v, mask):
        events.append("attend")
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        out.register_hook(lambda g: events.append("attend backward"))  # its gradient arrived: backward next
        return out

    with logged_all_to_alls(events):
        q, k, v = (torch.randn(1, 4, 4, 8, requires_grad=True) for _ in range(3))  # 2 heads a rank, in 2 groups
        out = cpm.ulysses_attention(q, k, v, dist.group.WORLD, inner=attend, chunks=2)
        forward = list(events)
        out.sum().backward()
    return forward, events[len(forward):]


def test_head_groups_start_every_all_to_all_before_waiting():
    """``chunks=2``, forward: both groups' q/k/v all-to-alls are in flight before the first group attends, and each
    group's output starts back before the next group attends. Backward: both output-gradient all-to-alls start before
    the last group's attention backward, whose q/k/v-gradient all-to-all starts before the first group's (NCCL orders
    a collective after the compute issued before it: the issue order is the overlap)."""
    for forward, backward in run_distributed(_schedule_worker, 2):
        assert forward == ["a2a", "a2a", "attend", "a2a", "attend", "a2a"], forward
        assert backward == ["a2a", "a2a", "attend backward", "a2a", "attend backward", "a2a"], backward
