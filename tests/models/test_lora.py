"""LoRA adapters: start equal to the base, merge exactly, train only the adapters, and compose with the
parallel plans (TP/SP expansion to lora_A/lora_B, FSDP2) on gloo processes as in one process."""

import os
import sys

import pytest
import torch

from nemo_vfm.models.common.lora import (
    LoRAConfig,
    LoRALinear,
    apply_lora,
    lora_state_dict,
    merge_lora,
    merge_lora_state_dict,
)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parallel"))

from bench.equivalence import tiny_config


def _inputs(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, cfg.in_channels, 2, 4, 4, generator=g)
    t = torch.rand(2, generator=g)
    ctx = torch.randn(2, 5, cfg.context_dim, generator=g)
    return x, t, ctx


def _lora_model(cfg, lora=None, seed=0):
    lora = lora or LoRAConfig(rank=4, alpha=8.0)
    torch.manual_seed(seed)
    m = cfg.build()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    apply_lora(m, lora)
    with torch.no_grad():  # adapters away from B = 0 so that merging and gradients are informative
        for n, p in m.named_parameters():
            if ".lora_" in n:
                p.copy_(0.1 * torch.randn_like(p))
    return m


def test_starts_as_base_and_freezes_everything_else():
    cfg = tiny_config()
    torch.manual_seed(0)
    base = cfg.build()
    x, t, ctx = _inputs(cfg)
    ref = base(x, t, ctx)
    names = apply_lora(base, LoRAConfig(rank=4))
    assert "blocks.0.attn.q" in names and "blocks.3.mlp.fc2" in names and "blocks.0.cross_attn.proj" in names
    assert not any("adaln" in n or "embed" in n for n in names)  # defaults: the TP plan's attention and MLP linears
    torch.testing.assert_close(base(x, t, ctx), ref, rtol=0, atol=0)  # B = 0
    trainable = {n for n, p in base.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(trainable) == 2 * len(names)


def test_targets_and_errors():
    cfg = tiny_config()
    m = cfg.build()
    assert apply_lora(m, targets=("blocks.1.mlp.*",), rank=2) == ["blocks.1.mlp.fc1", "blocks.1.mlp.fc2"]
    with pytest.raises(ValueError, match="already has LoRA"):
        apply_lora(m)
    with pytest.raises(ValueError, match="match no nn.Linear"):
        apply_lora(cfg.build(), targets=("nothing",))
    with pytest.raises(ValueError, match="rank"):
        LoRAConfig(rank=0)


def test_merge_equals_unmerged_and_state_dict_merge():
    cfg = tiny_config()
    m = _lora_model(cfg)
    x, t, ctx = _inputs(cfg)
    with torch.no_grad():
        out = m(x, t, ctx)
        state = {k: v.clone() for k, v in m.state_dict().items()}
        lin = m.blocks[0].attn.q
        lin.merge()
        torch.testing.assert_close(m(x, t, ctx), out, rtol=1e-5, atol=1e-5)
        lin.unmerge()
        torch.testing.assert_close(m(x, t, ctx), out, rtol=1e-5, atol=1e-5)
        merge_lora(m)
        assert not any(isinstance(mod, LoRALinear) for mod in m.modules())
        torch.testing.assert_close(m(x, t, ctx), out, rtol=1e-5, atol=1e-5)
        plain = cfg.build()
        plain.load_state_dict(merge_lora_state_dict(state, 8.0 / 4))  # strict: the plain model's keys exactly
        torch.testing.assert_close(plain(x, t, ctx), out, rtol=1e-5, atol=1e-5)
    assert set(lora_state_dict(state)) == {k for k in state if ".lora_" in k}


def test_compiled_block_trains_adapters():
    cfg = tiny_config(num_layers=2)
    m = _lora_model(cfg)
    x, t, ctx = _inputs(cfg)
    eager = m(x, t, ctx).square().mean()
    eager.backward()
    ref = {n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad}
    m.zero_grad()
    from nemo_vfm.parallel.compile import compile_blocks

    compile_blocks(m.blocks)
    loss = m(x, t, ctx).square().mean()
    loss.backward()
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-6)
    for n, g in ref.items():
        torch.testing.assert_close(dict(m.named_parameters())[n].grad, g, rtol=1e-4, atol=1e-6)


# -- parallel layouts on gloo ---------------------------------------------------------------------
def _problem(cfg):
    from bench import equivalence as E

    problem = E.make_problem(cfg)
    m = _lora_model(cfg)
    problem["state"] = {k: v.clone() for k, v in m.state_dict().items()}
    return problem


def _reference(cfg, problem, steps=2):
    from bench import equivalence as E

    m = cfg.build()
    apply_lora(m, LoRAConfig(rank=4, alpha=8.0))
    m.load_state_dict(problem["state"])
    trainable = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trainable, lr=0.5)
    b = E._rows(problem, slice(None), "cpu")
    res = {"loss": [], "grads": []}
    for _ in range(steps):
        opt.zero_grad()
        loss = E.forward_loss(m, b)
        loss.backward()
        res["grads"].append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
        res["loss"].append(loss.item())
        opt.step()
    res["params"] = {n: p.detach().clone() for n, p in m.named_parameters()}
    return res


def _layout(dims_kw, world, problem, steps=2):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from bench import equivalence as E
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.grads import split_dtensor_groups
    from nemo_vfm.parallel.mesh import build_mesh

    cfg = tiny_config()
    dims = ParallelDims(world_size=world, **dims_kw)
    pmesh = build_mesh(dims, "cpu")
    m = cfg.build()
    apply_lora(m, LoRAConfig(rank=4, alpha=8.0))
    m.load_state_dict(problem["state"])
    E.plan_of(cfg).parallelize(m, pmesh, param_dtype=None, reduce_dtype=None)
    full = {k: v.clone() for k, v in problem["state"].items()}  # set_model_state_dict rewrites its argument
    set_model_state_dict(m, full, options=StateDictOptions(full_state_dict=True, strict=True))
    trainable = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.SGD(split_dtensor_groups([{"params": trainable}]), lr=0.5, foreach=True)
    res = E.train_steps([m], None, pmesh, problem, opt, steps=steps, max_norm=1e9)
    res["params"] = E._collect([m], "param")
    # AdamW over what DiffusionModule.configure_optimizers passes (requires_grad only): adapter state alone
    adam = torch.optim.AdamW(split_dtensor_groups([{"params": trainable}]), lr=1e-3)
    E.forward_loss(m, E._rows(problem, slice(0, 2), "cpu")).backward()
    adam.step()
    local = sum(v.to_local().numel() if hasattr(v, "to_local") else v.numel()
                for s in adam.state.values() for k, v in s.items() if k != "step")
    full = sum(p.numel() for p in trainable)
    return {**res, "adam_local": local, "trainable_full": full, "frozen_grads": [
        n for n, p in m.named_parameters() if not p.requires_grad and p.grad is not None]}


LAYOUTS = {"fsdp2": dict(dp_shard=2, fsdp=True), "tp2_sp": dict(tp=2, sequence_parallel=True), "tp2": dict(tp=2)}


def _layouts(rank, world, problem, names):
    return {name: _layout(LAYOUTS[name], world, problem) for name in names}


def _run_layouts(names):
    from gloo_launcher import run_distributed

    cfg = tiny_config()
    problem = _problem(cfg)
    ref = _reference(cfg, problem)
    results = run_distributed(_layouts, 2, problem, names)
    for name in names:
        _check([r[name] for r in results], ref)


def test_lora_fsdp2_matches_one_process():
    """FSDP2 on 2 gloo processes: the adapters train as in one process, nothing else gets a gradient, and the
    optimizer state is the adapters' alone, sharded."""
    _run_layouts(["fsdp2"])


@pytest.mark.slow  # ~60 s on a loaded 2-core machine
def test_lora_tensor_parallel_matches_one_process():
    """TP2 + SP and TP2 (one launch): the plan expanded to lora_A / lora_B gives the single-process run."""
    _run_layouts(["tp2_sp", "tp2"])


def _check(got, ref):
    r0 = got[0]
    assert not r0["frozen_grads"]
    for step in range(2):
        assert abs(r0["loss"][step] - ref["loss"][step]) <= 1e-5 * abs(ref["loss"][step])
        assert set(r0["grads"][step]) == set(ref["grads"][step])  # adapters only
        for n, g in ref["grads"][step].items():
            torch.testing.assert_close(r0["grads"][step][n], g, rtol=1e-4, atol=1e-6)
    for n, p in ref["params"].items():
        torch.testing.assert_close(r0["params"][n], p, rtol=1e-4, atol=1e-6)
    # optimizer state: exp_avg + exp_avg_sq of the adapters only, each split over the 2 ranks (FSDP2 shards,
    # or TP's column/row pieces of lora_A and lora_B)
    assert sum(r["adam_local"] for r in got) == 2 * r0["trainable_full"]
    assert got[0]["adam_local"] == got[1]["adam_local"]
    assert r0["trainable_full"] < 0.1 * sum(p.numel() for p in ref["params"].values())
