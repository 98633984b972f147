"""FP8 LoRA bases (``frozen_dtype="fp8"``) under the parallel layouts, on 2 gloo processes: FSDP2 shards the e4m3
bits (1 byte a weight on every rank: half of each base weight per rank) and their row scales, TP splits them
like the layer they replace (column-wise: bits and scales by rows; row-wise: bits by columns, scales replicated),
and two SGD steps give the single-process losses, adapter gradients and adapter weights (after
``fill_quantized``, a streaming loader's path, has written every rank's pieces again from the float weights).
Under FSDP2 with bf16 mixed precision the gathered weights are bit-for-bit the single-process ones (bits
gathered as uint8, scales bf16-representable).

The other frozen weights are put back to fp32 here (fp8 mode keeps them in bf16) so that the comparison is exact
fp32 arithmetic that isolates the layout of the fp8 bases."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from bench.equivalence import tiny_config

LORA = dict(rank=4, alpha=8.0, frozen_dtype="fp8")
LAYOUTS = {"fsdp2": dict(dp_shard=2, fsdp=True), "fsdp2_bf16": dict(dp_shard=2, fsdp=True),
           "tp2_sp": dict(tp=2, sequence_parallel=True), "tp2": dict(tp=2)}
PROBE = "blocks.1.mlp.fc2.base"  # a row-wise layer under TP


def _cfg():
    return tiny_config(num_layers=2)


def _problem():
    from bench import equivalence as E

    cfg = _cfg()
    problem = E.make_problem(cfg)
    g = torch.Generator().manual_seed(3)
    net = _build(cfg, problem, adapters=None)
    problem["adapters"] = {n: 0.1 * torch.randn(p.shape, generator=g) for n, p in net.named_parameters()
                           if p.requires_grad}
    return problem


def _build(cfg, problem, adapters="problem"):
    from nemo_vfm.models.common.lora import LoRAConfig, apply_lora

    m = cfg.build()
    m.load_state_dict(problem["state"])
    apply_lora(m, LoRAConfig(**LORA))
    for p in m.parameters():
        if p.dtype == torch.bfloat16:
            p.data = p.data.float()
    if adapters is not None:
        with torch.no_grad():
            for n, p in m.named_parameters():
                if p.requires_grad:
                    p.copy_(problem["adapters"][n])
    return m


def _dequantized(m) -> dict:
    from nemo_vfm.models.common.fp8_weights import FP8FrozenLinear

    return {n: mod for n, mod in m.named_modules() if isinstance(mod, FP8FrozenLinear)}


def _reference(problem, steps=2):
    from bench import equivalence as E

    m = _build(_cfg(), problem)
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.5)
    b = E._rows(problem, slice(None), "cpu")
    res = {"loss": [], "grads": []}
    for _ in range(steps):
        opt.zero_grad()
        loss = E.forward_loss(m, b)
        loss.backward()
        res["grads"].append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
        res["loss"].append(loss.item())
        opt.step()
    res["params"] = {n: p.detach().clone() for n, p in m.named_parameters() if p.requires_grad}
    res["weights"] = {n: mod.dequantized_weight(torch.float32) for n, mod in _dequantized(m).items()}
    return res


def _layout(name, world, problem, steps=2):
    from torch.distributed.tensor import DTensor

    from bench import equivalence as E
    from nemo_vfm.models.common.fp8_weights import fill_quantized
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.grads import split_dtensor_groups
    from nemo_vfm.parallel.mesh import build_mesh

    cfg = _cfg()
    pmesh = build_mesh(ParallelDims(world_size=world, **LAYOUTS[name]), "cpu")
    m = _build(cfg, problem)
    bf16 = name == "fsdp2_bf16"
    E.plan_of(cfg).parallelize(m, pmesh, param_dtype="bf16" if bf16 else None, reduce_dtype=None)
    fp8 = _dequantized(m)
    read = 0  # a streaming loader's path: wipe the shards, quantise the float weights again, each rank its rows
    for n, mod in fp8.items():
        mod.weight.to_local().zero_()
        mod.weight_scale.to_local().zero_()
        full = problem["state"][n.removesuffix(".base") + ".weight"]
        read += fill_quantized(mod, lambda region, f=full: f if region is None else f[region])
    gathered = {}

    def capture(mod, args):  # the weight a layer computes with, inside its forward (FSDP2: gathered)
        gathered.setdefault(names[mod], mod.dequantized_weight(torch.float32))

    names = {mod: n for n, mod in fp8.items()}
    for mod in fp8.values():
        mod.register_forward_pre_hook(capture)
    probe = fp8[PROBE]
    w, s = probe.weight, probe.weight_scale
    where = lambda t: [(type(p).__name__, getattr(p, "dim", None)) for p in t.placements]  # noqa: E731
    layout = {"weight": (str(w.dtype), where(w)), "scale": where(s),
              "local_bytes": sum(mod.weight.to_local().numel() for mod in fp8.values()),
              "full_bytes": sum(mod.weight.numel() for mod in fp8.values()), "read": read}
    trainable = [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.SGD(split_dtensor_groups([{"params": trainable}]), lr=0.5, foreach=True)
    res = E.train_steps([m], None, pmesh, problem, opt, steps=steps, max_norm=1e9)
    res["params"] = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                     for n, p in m.named_parameters() if p.requires_grad}
    res["weights"] = {n: t.full_tensor() if isinstance(t, DTensor) else t for n, t in gathered.items()}
    res["frozen_grads"] = [n for n, p in m.named_parameters() if not p.requires_grad and p.grad is not None]
    return {**res, "layout": layout}


def _layouts(rank, world, problem):
    return {name: _layout(name, world, problem) for name in LAYOUTS}


def test_fp8_bases_shard_and_train_as_in_one_process():
    from gloo_launcher import run_distributed

    problem = _problem()
    ref = _reference(problem)
    results = run_distributed(_layouts, 2, problem)
    for name in LAYOUTS:
        r0, r1 = results[0][name], results[1][name]
        assert not r0["frozen_grads"], name
        lay = r0["layout"]
        assert lay["weight"][0] == "torch.uint8" and 2 * lay["local_bytes"] == lay["full_bytes"], (name, lay)
        assert r0["layout"] == r1["layout"]
        # fill_quantized read whole rows: its own half of them under FSDP2, all of a row-wise layer's under TP
        if name.startswith("fsdp"):
            assert 2 * lay["read"] == lay["full_bytes"], lay
        else:
            assert lay["full_bytes"] / 2 < lay["read"] < lay["full_bytes"], lay
        if name.startswith("tp"):  # fc2 is row-wise: bits split by input columns, scales whole on both ranks
            assert lay["weight"][1] == [("Shard", 1)] and lay["scale"] == [("Replicate", None)], lay
        else:
            assert lay["weight"][1] == lay["scale"] == [("Shard", 0)], lay
        assert set(r0["weights"]) == set(ref["weights"])
        for n, w in ref["weights"].items():  # every rank computes with the single-process weights, exactly
            assert torch.equal(r0["weights"][n], w) and torch.equal(r1["weights"][n], w), (name, n)
        if name == "fsdp2_bf16":  # bf16 compute of the adapters and activations: close, not equal
            assert abs(r0["loss"][0] - ref["loss"][0]) <= 2e-2 * ref["loss"][0], (r0["loss"], ref["loss"])
            continue
        for step in range(2):
            assert abs(r0["loss"][step] - ref["loss"][step]) <= 1e-5 * abs(ref["loss"][step]), name
            assert set(r0["grads"][step]) == set(ref["grads"][step])  # adapters only
            for n, g in ref["grads"][step].items():
                torch.testing.assert_close(r0["grads"][step][n], g, rtol=1e-4, atol=1e-6)
        for n, p in ref["params"].items():
            torch.testing.assert_close(r0["params"][n], p, rtol=1e-4, atol=1e-6)
