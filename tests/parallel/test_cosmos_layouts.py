"""Cosmos-Predict2.5 under TP2, TP2+SP, CP2 (ring, all-to-all), FSDP2 (+ full AC) trains like one process (gloo,
CPU): 3 SGD steps of the equivalence harness's problem, losses, gradient norms, every gradient and the final
weights compared; a saved Cosmos folder streams into FSDP2- and TP-sharded models. Video2World inputs (per-token
times, condition mask) under TP2, TP2+SP and CP2 give one process's loss and gradients; pipeline parallelism is
refused by name."""

import pytest
import torch
from gloo_launcher import run_distributed

from bench import equivalence as E

LAYOUTS_2 = {
    "TP2": dict(tp=2),
    "SP+TP2": dict(tp=2, sequence_parallel=True),
    "CP2 ring": dict(cp=2),
    "CP2 all-to-all": dict(cp=2, cp_kind="a2a"),
    "FSDP2": dict(),
    "FSDP2 + full AC": dict(activation_checkpointing="full"),
}
_AC = ("activation_checkpointing",)


def cosmos_cfg():
    from nemo_vfm.models.cosmos.model import CosmosConfig

    return CosmosConfig(num_layers=2, hidden_size=64, num_heads=4, in_channels=4, out_channels=4, context_dim=32,
                        text_dim=16, adaln_lora_dim=8)


def _worker(rank, world, layouts, folder):
    from torch.distributed.tensor import DTensor

    from nemo_vfm.models.cosmos.family import SPEC
    from nemo_vfm.models.cosmos.weights import load_weights
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.mesh import build_mesh

    cfg = cosmos_cfg()
    problem = E.make_problem(cfg)
    out = {}
    for name, kw in layouts.items():
        dims_kw = {k: v for k, v in kw.items() if k not in _AC}
        extra = {k: v for k, v in kw.items() if k in _AC}
        out[name] = E.run_layout(cfg, problem, ParallelDims(world_size=world, **dims_kw), **extra)
    loaded = {}
    for name, dims_kw in {"FSDP2": {}, "TP2": dict(tp=2)}.items():
        pmesh = build_mesh(ParallelDims(world_size=world, **dims_kw))
        model = SPEC.parallelize(cfg.build("meta"), pmesh, param_dtype=None, reduce_dtype=None)
        model.to_empty(device="cpu")
        load_weights(model, folder)
        assert any(isinstance(p, DTensor) for p in model.parameters())
        loaded[name] = {k: (v.full_tensor() if isinstance(v, DTensor) else v).clone() for k, v in
                        model.state_dict().items()}
    out["loaded"] = loaded
    return out


@pytest.fixture(scope="module")
def reference():
    cfg = cosmos_cfg()
    return E.run_reference(cfg, E.make_problem(cfg))


def test_cosmos_two_process_layouts_match_single_process(reference, tmp_path):
    from nemo_vfm.models.cosmos.convert import save_weights

    cfg = cosmos_cfg()
    state = E.make_problem(cfg)["state"]
    save_weights(state, tmp_path, cfg, max_shard_bytes=50_000)
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


def _v2w_problem():
    torch.manual_seed(0)
    model = cosmos_cfg().build()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    B, T, H, W = 2, 3, 4, 2  # 6 tokens: not a multiple of 4, so CP/SP pad
    t = torch.rand(B, generator=g)
    per_frame = torch.stack([torch.full((B,), 1e-4), t, t], dim=1)  # first latent frame clean
    cond = torch.zeros(B, 1, T, H, W)
    cond[:, :, :1] = 1
    batch = {"x": torch.randn(B, 4, T, H, W, generator=g), "t": per_frame.repeat_interleave((H // 2) * (W // 2), 1),
             "context": torch.randn(B, 5, 32, generator=g), "cond_mask": cond,
             "target": torch.randn(B, 4, T, H, W, generator=g)}
    return {"state": {k: v.clone() for k, v in model.state_dict().items()}, "latent": (T, H, W)}, batch


def _v2w_loss(model, b):
    out = model(b["x"], b["t"], b["context"], cond_mask=b["cond_mask"])
    return ((out - b["target"]) ** 2).mean()


def _v2w_worker(rank, world, layouts):
    from nemo_vfm.models.cosmos import family as P
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.grads import sync_grads

    problem, b = _v2w_problem()
    out = {}
    for name, kw in layouts.items():
        pmesh, modules, _ = E.build_parallel(cosmos_cfg(), problem, ParallelDims(world_size=world, **kw),
                                             torch.device("cpu"), param_dtype=None, reduce_dtype=None)
        loss = _v2w_loss(modules[0], b)
        loss.backward()
        sync_grads(modules[0], pmesh, tp_partial=P.TP_PARTIAL)
        out[name] = (loss.item(), E._collect(modules, "grad"))
    return out


V2W_LAYOUTS = {"TP2": dict(tp=2), "SP+TP2": dict(tp=2, sequence_parallel=True), "CP2": dict(cp=2)}


def test_cosmos_video2world_gradients_under_tp_sp_cp_match_single_process():
    """Per-token conditioning (emb, temb split with the tokens) and the padded token split: same loss and every
    gradient as one process (data-parallel size 1, so every rank sees the whole batch)."""
    problem, b = _v2w_problem()
    model = cosmos_cfg().build("meta").to_empty(device="cpu")
    model.load_state_dict(problem["state"])
    loss = _v2w_loss(model, b)
    loss.backward()
    ref = {n: p.grad for n, p in model.named_parameters()}
    for name, (got_loss, grads) in run_distributed(_v2w_worker, 2, V2W_LAYOUTS)[0].items():
        assert abs(got_loss - loss.item()) <= 1e-5 * loss.item(), name
        for n, g in ref.items():
            assert ((grads[n] - g).abs().max() <= 1e-4 * g.abs().max().clamp_min(1e-8)), (name, n)


def test_pipeline_parallel_is_refused_by_name():
    from nemo_vfm.models.cosmos.family import check_layout
    from nemo_vfm.parallel.dims import ParallelDims

    with pytest.raises(ValueError, match="Cosmos has no pipeline-parallel plan"):
        check_layout(cosmos_cfg(), ParallelDims(world_size=2, pp=2))
