"""Sparse self-attention under parallel layouts (gloo, CPU): all-to-all context parallelism (all tokens, half the
heads per rank: the pattern applies unchanged), TP2 + sequence parallel (tokens gathered before attention) and
FSDP2 train like one process with ``attention="sta"`` (and VSA under CP all-to-all and TP, its gate split by heads),
on a grid whose 15 tokens are padded to 16 for the split; ring CP and pipeline stages are refused by the family's
``check_layout`` with the fix named."""

import pytest
from gloo_launcher import run_distributed

from bench import equivalence as E
from nemo_vfm.parallel.dims import ParallelDims

LATENT = (5, 2, 6)  # patch (1, 2, 2) -> a 5 x 1 x 3 grid: 15 tokens, padded to 16 under CP2 / SP2
STA = dict(attention="sta", attention_tile=(1, 1, 1), attention_window=(3, 1, 1))  # 3 of 5 frames, own (h, w)
VSA = dict(attention="vsa", attention_tile=(1, 1, 3), attention_sparsity=0.5)  # 5 tiles (frames), top 3
RUNS = {  # name -> (family, attention settings, parallel dims)
    "wan sta CP2 all-to-all": ("wan", STA, dict(cp=2, cp_kind="a2a")),
    "wan sta SP+TP2": ("wan", STA, dict(tp=2, sequence_parallel=True)),
    "wan sta FSDP2": ("wan", STA, dict()),
    "wan vsa CP2 all-to-all": ("wan", VSA, dict(cp=2, cp_kind="a2a")),
    "wan vsa SP+TP2": ("wan", VSA, dict(tp=2, sequence_parallel=True)),
    "dit vsa TP2": ("dit", VSA, dict(tp=2)),
    "dit sta CP2 all-to-all": ("dit", STA, dict(cp=2, cp_kind="a2a")),
}


def _cfg(family, attention):
    if family == "wan":
        from nemo_vfm.models.wan.model import WanConfig

        return WanConfig(
            num_layers=2,
            hidden_size=48,
            num_heads=4,
            ffn_size=64,
            in_channels=4,
            out_channels=4,
            context_dim=32,
            freq_dim=32,
            text_len=8,
            **attention,
        )
    return E.tiny_config(num_layers=2, **attention)


def _worker(rank, world):
    out = {}
    for name, (family, attention, dims) in RUNS.items():
        cfg = _cfg(family, attention)
        out[name] = E.run_layout(
            cfg, E.make_problem(cfg, latent=LATENT), ParallelDims(world_size=world, **dims), steps=2
        )
    return out


def test_sparse_attention_layouts_match_single_process():
    results = run_distributed(_worker, 2)
    failures = {}
    for name, (family, attention, _) in RUNS.items():
        cfg = _cfg(family, attention)
        problem = E.make_problem(cfg, latent=LATENT)
        ref = E.run_reference(cfg, problem, steps=2)
        dense_problem = {
            **problem,
            "state": {k: v for k, v in problem["state"].items() if "gate_compress" not in k},
        }
        dense = E.run_reference(_cfg(family, {}), dense_problem, steps=2)
        assert abs(dense["loss"][0] - ref["loss"][0]) > 1e-4 * abs(ref["loss"][0]), (
            name
        )  # the pattern matters
        errs = E.compare(ref, E.merge_ranks([r[name] for r in results]))
        if not (
            errs["loss"] < 1e-5 and errs["norm"] < 1e-5 and errs["grads"] < 1e-4 and errs["params"] < 1e-5
        ):
            failures[name] = errs
    assert not failures, failures


@pytest.mark.parametrize("family", ["wan", "dit"])
def test_layouts_that_cannot_apply_a_tile_pattern_are_refused(family):
    cfg = _cfg(family, STA)
    check = E.plan_of(cfg).check_layout
    with pytest.raises(
        ValueError,
        match=r"ring context parallelism \(cp=2\) splits them; use all-to-all context "
        r"parallelism \(context_parallel_kind='a2a'",
    ):
        check(cfg, ParallelDims(world_size=2, cp=2, cp_kind="ring"))
    check(cfg, ParallelDims(world_size=4, cp=2, cp_kind="a2a", tp=2, sequence_parallel=True))  # fine
    check(_cfg(family, {}), ParallelDims(world_size=2, cp=2, cp_kind="ring"))
    check(_cfg(family, VSA), ParallelDims(world_size=2, tp=2))  # VSA's gate is split by heads as q
    if family == "dit":
        with pytest.raises(NotImplementedError, match="under pipeline parallelism is not implemented"):
            check(cfg, ParallelDims(world_size=2, pp=2))
