"""Wan under TP2, TP2+SP, CP2 (ring, all-to-all), FSDP2 (+ full AC) trains like one process (gloo, CPU):
3 SGD steps of the equivalence harness's problem, losses, gradient norms, every gradient and the final
weights compared. Also: a Wan weights folder streams into an FSDP2- / TP-sharded model (each rank
materialises only its shards) and gives the single-process weights."""

import pytest
import torch
from gloo_launcher import run_distributed

from nemo_vfm.parallel import equivalence as E

LAYOUTS_2 = {
    "TP2": dict(tp=2),
    "SP+TP2": dict(tp=2, sequence_parallel=True),
    "CP2 ring": dict(cp=2),
    "CP2 all-to-all": dict(cp=2, cp_kind="a2a"),
    "FSDP2": dict(),
    "FSDP2 + full AC": dict(activation_checkpointing="full"),
}
_AC = ("activation_checkpointing",)


def wan_cfg():
    from nemo_vfm.models.wan.model import WanConfig

    return WanConfig(num_layers=2, hidden_size=48, num_heads=4, ffn_size=64, in_channels=4, out_channels=4,
                     context_dim=32, freq_dim=32, text_len=8)


def _worker(rank, world, layouts, folder):
    from torch.distributed.tensor import DTensor

    from nemo_vfm.models.wan.convert import load_weights
    from nemo_vfm.models.wan.parallelize import parallelize_wan
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.mesh import build_mesh

    cfg = wan_cfg()
    problem = E.make_problem(cfg)
    out = {}
    for name, kw in layouts.items():
        dims_kw = {k: v for k, v in kw.items() if k not in _AC}
        extra = {k: v for k, v in kw.items() if k in _AC}
        out[name] = E.run_layout(cfg, problem, ParallelDims(world_size=world, **dims_kw), **extra)
    loaded = {}
    for name, dims_kw in {"FSDP2": {}, "TP2": dict(tp=2)}.items():
        pmesh = build_mesh(ParallelDims(world_size=world, **dims_kw))
        model = parallelize_wan(cfg.build("meta"), pmesh, param_dtype=None, reduce_dtype=None)
        model.to_empty(device="cpu")
        load_weights(model, folder)
        assert any(isinstance(p, DTensor) for p in model.parameters())
        loaded[name] = {k: (v.full_tensor() if isinstance(v, DTensor) else v).clone() for k, v in
                        model.state_dict().items()}
    out["loaded"] = loaded
    return out


@pytest.fixture(scope="module")
def reference():
    cfg = wan_cfg()
    return E.run_reference(cfg, E.make_problem(cfg))


def test_wan_two_process_layouts_match_single_process(reference, tmp_path):
    from nemo_vfm.models.wan.convert import save_weights

    cfg = wan_cfg()
    state = E.make_problem(cfg)["state"]
    save_weights(state, tmp_path, cfg, layout="diffusers", max_shard_bytes=50_000)
    results = run_distributed(_worker, 2, LAYOUTS_2, str(tmp_path))
    failures = {}
    for name in LAYOUTS_2:
        errs = E.compare(reference, E.merge_ranks([r[name] for r in results]))
        if not (errs["loss"] < 1e-5 and errs["norm"] < 1e-5 and errs["grads"] < 1e-4 and errs["params"] < 1e-5):
            failures[name] = errs
    assert not failures, failures
    for r in results:
        for name, got in r["loaded"].items():
            for k, v in state.items():
                assert torch.equal(got[k], v), (name, k)
