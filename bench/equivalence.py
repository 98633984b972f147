"""Check that a parallel layout trains exactly like one process: same losses, gradients, weights.

Not library code (it builds DiT/MovieGen models, the EDM objective and packed data on top of
``nemo_vfm.parallel``): ``from bench import equivalence``. Used by ``tests/parallel`` (gloo, CPU) and
``bench/parallel_equivalence.py`` (NCCL, GPUs):

    problem = make_problem(cfg)                      # fixed weights, batch, noise levels, noise
    ref = run_reference(cfg, problem, steps=3)       # plain model, one process
    got = run_layout(cfg, problem, dims, steps=3)    # every rank; got["grads"] are full tensors
    errors = compare(ref, got)                       # max relative errors

The objective is EDM's (preconditioning and loss weight) with noise levels and noise fixed in the
problem, so that every layout sees the same numbers; SGD keeps weight differences proportional to
gradient differences (Adam would amplify round-off in near-zero gradients).

``make_packed_problem`` gives one packed THD batch instead (images and videos of several grids, padded
per sample, segments straddling the CP boundaries); every data-parallel rank trains on that same
batch. The model family (DiT, MovieGen) and its parallel plan follow from ``cfg``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from nemo_vfm.parallel.dims import ParallelDims
from nemo_vfm.parallel.grads import clean_name, clip_grad_norm_, split_dtensor_groups, sync_grads


def tiny_config(**overrides):
    """A 4-block DiT with cross-attention, QK-norm, AdaLN-LoRA and 3D RoPE (every parallel path)."""
    from nemo_vfm.models.dit.model import DiTConfig

    kw = dict(num_layers=4, hidden_size=64, num_heads=4, in_channels=4, patch_size=(1, 2, 2), context_dim=32,
              adaln_lora_rank=8, qk_norm=True, mlp="gelu", pos_embed="rope3d")
    return DiTConfig(**{**kw, **overrides})


def _perturbed_model(cfg, seed: int):
    """The network of ``cfg`` with weights perturbed away from the zero init, so every gradient is informative."""
    torch.manual_seed(seed)
    model = cfg.build("cpu")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def make_problem(cfg, *, batch: int = 4, latent=(2, 4, 4), text_len: int = 5, seed: int = 0) -> dict:
    """Weights (perturbed away from the zero init so every gradient is informative) and one batch."""
    from nemo_vfm.diffusion.edm import EDM

    model = _perturbed_model(cfg, seed)
    g = torch.Generator().manual_seed(seed + 1)
    T, H, W = latent
    x0 = torch.randn(batch, cfg.in_channels, T, H, W, generator=g)
    edm = EDM()
    sigma = edm.sample_sigma(batch, g)
    noise = torch.randn(x0.shape, generator=g)
    c_skip, c_out, c_in, c_noise = edm.precondition(sigma)
    ctx = torch.randn(batch, text_len, cfg.context_dim, generator=g) if cfg.context_dim else None
    mask = torch.ones(batch, text_len, dtype=torch.bool)
    mask[0, 3:] = False
    return {"state": {k: v.clone() for k, v in model.state_dict().items()}, "x0": x0, "sigma": sigma,
            "x_noisy": x0 + sigma.view(-1, 1, 1, 1, 1) * noise, "c_skip": c_skip, "c_out": c_out, "c_in": c_in,
            "c_noise": c_noise, "weight": edm.loss_weight(sigma), "context": ctx, "context_mask": mask,
            "latent": latent}


PACKED_SHAPES = ((1, 4, 6), (3, 4, 4), (2, 6, 2), (1, 2, 2))  # latent (t, h, w) of the packed samples


def make_packed_problem(cfg, *, shapes=PACKED_SHAPES, pad_to_multiple: int = 4, seed: int = 0) -> dict:
    """Weights and one packed batch of ``shapes`` (in this order) with per-token EDM numbers.

    With patch (1, 2, 2) and ``pad_to_multiple=4`` the segments span tokens 0:8, 8:20, 20:28, 28:32
    (6, 12, 6 and 1 real tokens), so one segment straddles the middle (CP2) and others the CP4 cuts.
    """
    import copy

    from nemo_vfm.data.batch import TokenSample, patchify
    from nemo_vfm.data.packing import pack_samples
    from nemo_vfm.diffusion.edm import EDM

    model = _perturbed_model(cfg, seed)
    g = torch.Generator().manual_seed(seed + 1)
    samples = []
    for i, (t, h, w) in enumerate(shapes):
        lat = torch.randn(cfg.in_channels, t, h, w, generator=g)
        tokens, pos = patchify(lat, cfg.patch_size)
        text = torch.randn(2 + i, cfg.context_dim or 1, generator=g)
        samples.append(TokenSample(key=f"s{i}", tokens=tokens, pos_ids=pos, loss_mask=torch.ones(len(tokens)),
                                   text=text, latent_shape=(cfg.in_channels, t, h, w), patch_size=cfg.patch_size,
                                   fps=8.0 + i, num_real_tokens=len(tokens)))
    batch = pack_samples(samples, pad_to_multiple)
    edm = EDM()
    sigma = edm.sample_sigma(batch.num_segments, g)[batch.seg_ids]  # (N,)
    noise = torch.randn(batch.tokens.shape, generator=g)
    c_skip, c_out, c_in, c_noise = edm.precondition(sigma)
    return {"state": {k: v.clone() for k, v in model.state_dict().items()}, "packed": copy.copy(batch),
            "x0": batch.tokens, "x_noisy": batch.tokens + sigma[:, None] * noise, "c_skip": c_skip, "c_out": c_out,
            "c_in": c_in, "c_noise": c_noise[batch.cu_seqlens[:-1].long()], "weight": edm.loss_weight(sigma),
            "context": batch.text if cfg.context_dim else None}


def packed_loss(out: torch.Tensor, b: dict) -> torch.Tensor:
    """EDM loss of a packed problem given the network output ``out (N, P)``: mean over real tokens."""
    denoised = b["c_skip"][:, None] * b["x_noisy"] + b["c_out"][:, None] * out.float()
    err = b["weight"][:, None] * (denoised - b["x0"]) ** 2
    mask = b["packed"].loss_mask.to(err.dtype)[:, None].expand_as(err)
    return (err * mask).sum() / mask.sum()


def _rows(problem: dict, sl: slice, device) -> dict:
    """This data-parallel rank's rows of an unpacked problem, or all of a packed one, on ``device``."""
    import copy

    if "packed" in problem:
        sl = slice(None)
    out = {k: (v[sl].to(device) if torch.is_tensor(v) and k != "state" else v) for k, v in problem.items()}
    if "packed" in out:
        out["packed"] = copy.copy(out["packed"]).to(device)
    return out


def forward_loss(model, b: dict) -> torch.Tensor:
    """The loss of batch ``b`` (from :func:`_rows`) under ``model``: mean over samples, or over packed tokens;
    plus the MoE layers' load-balancing loss when there is one."""
    from nemo_vfm.models.common.moe import collect_aux_loss

    if "packed" in b:
        x_in = b["x_noisy"] * b["c_in"][:, None]
        out = model(x_in, b["c_noise"], context=b["context"], packed=b["packed"])
        loss = packed_loss(out, b)
    else:
        x_in, cond = _net_inputs(b)
        out = model(x_in, b["c_noise"], **cond)
        loss = per_sample_loss(out, b, torch.arange(x_in.shape[0], device=x_in.device)).mean()
    aux = collect_aux_loss(model)
    return loss if aux is None else loss + aux


def plan_of(cfg):
    """The declared spec of ``cfg``'s model family (:class:`nemo_vfm.models.spec.FamilySpec`)."""
    from nemo_vfm.models.families import family_spec

    return family_spec(cfg)


def per_sample_loss(out: torch.Tensor, b: dict, idx: torch.Tensor) -> torch.Tensor:
    """EDM loss of samples ``idx`` given the network output ``out`` (len(idx), C, T, H, W): (len(idx),)."""
    v = lambda t: t[idx].view(-1, 1, 1, 1, 1)
    denoised = v(b["c_skip"]) * b["x_noisy"][idx] + v(b["c_out"]) * out.float()
    return b["weight"][idx] * ((denoised - b["x0"][idx]) ** 2).flatten(1).mean(1)


def _net_inputs(b: dict) -> tuple[torch.Tensor, dict]:
    x_in = b["x_noisy"] * b["c_in"].view(-1, 1, 1, 1, 1)
    cond = {"context": b["context"], "context_mask": b["context_mask"]}
    return x_in, {k: v for k, v in cond.items() if v is not None}


def run_reference(cfg, problem: dict, *, steps: int = 3, lr: float = 0.5, max_norm: float = 1.0,
                  momentum: float = 0.0, device="cpu") -> dict:
    """The single-process run: per step the loss, gradient norm and gradients; final weights."""
    model = cfg.build("meta").to_empty(device=device)
    model.load_state_dict(problem["state"])
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    b = _rows(problem, slice(None), device)
    res = {"loss": [], "norm": [], "grads": []}
    for _ in range(steps):
        opt.zero_grad()
        loss = forward_loss(model, b)
        loss.backward()
        res["grads"].append({n: p.grad.detach().float().cpu().clone() for n, p in model.named_parameters()})
        res["norm"].append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item())
        res["loss"].append(loss.item())
        opt.step()
    res["params"] = {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}
    return res


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _collect(modules, what: str) -> dict:
    out = {}
    for m in modules:
        for n, p in m.named_parameters():
            t = p.grad if what == "grad" else p.detach()
            name = clean_name(n)
            if t is not None:
                full = _full(t).detach().float().cpu().clone()
                out.setdefault(name, full)
    return out


def build_parallel(cfg, problem: dict, dims: ParallelDims, device, **parallelize_kwargs):
    """(pmesh, modules, runner or None) for ``dims``, loaded with the problem's weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from nemo_vfm.parallel.mesh import build_mesh

    P = plan_of(cfg)
    if dims.pp > 1 and "packed" in problem:
        raise ValueError("packed problems run without pipeline parallelism (the stages take unpacked latents)")
    pmesh = build_mesh(dims, device.type)
    model = cfg.build("meta").to_empty(device=device)
    model.load_state_dict({k: v.to(device) for k, v in problem["state"].items()})
    kw = {"param_dtype": None, "reduce_dtype": None, **parallelize_kwargs}
    if dims.pp > 1:
        from nemo_vfm.parallel.pipeline import PipelineRunner

        stages, ids = P.build_pipeline_stages(model, pmesh, **kw)
        for st in stages:
            P.set_stage_grid(st, problem["latent"])
        runner = PipelineRunner(stages, ids, pmesh, device=device, pp_duplicated=P.pp_duplicated)
        modules = stages
    else:
        runner = None
        modules = [P.parallelize(model, pmesh, **kw)]
    # a state dict saved from the plain model loads into any layout (exercised again by DCP tests)
    full = {k: v.to(device) for k, v in problem["state"].items()}
    for m in modules:
        set_model_state_dict(m, full, options=StateDictOptions(full_state_dict=True, strict=False))
    return pmesh, modules, runner


def run_layout(cfg, problem: dict, dims: ParallelDims, *, steps: int = 3, lr: float = 0.5, max_norm: float = 1.0,
               momentum: float = 0.0, device=None, **parallelize_kwargs) -> dict:
    """The same run under ``dims`` (call on every rank); gradients and weights come back full-size."""
    device = torch.device(device or "cpu")
    pmesh, modules, runner = build_parallel(cfg, problem, dims, device, **parallelize_kwargs)
    params = [p for m in modules for p in m.parameters()]
    # foreach=True as on CUDA (the CPU default is the per-tensor loop): the multi-tensor kernels are what
    # need the DTensor/plain-tensor split
    opt = torch.optim.SGD(split_dtensor_groups([{"params": params}]), lr=lr, momentum=momentum, foreach=True)
    res = train_steps(modules, runner, pmesh, problem, opt, steps=steps, max_norm=max_norm, device=device)
    res["params"] = _collect(modules, "param")
    return res


def train_steps(modules, runner, pmesh, problem: dict, opt, *, steps: int, max_norm: float = 1.0,
                device=None) -> dict:
    """``steps`` optimizer steps of the problem's batch under an already built layout."""
    P = plan_of(modules[0].cfg)
    device = torch.device(device or "cpu")
    B = problem["x0"].shape[0]
    dp, dp_rank = pmesh.size("dp"), pmesh.rank("dp")
    if B % dp and "packed" not in problem:
        raise ValueError(f"batch {B} is not divisible by {dp} data-parallel ranks.")
    n = B // dp
    b = _rows(problem, slice(dp_rank * n, (dp_rank + 1) * n), device)
    res = {"loss": [], "norm": [], "grads": []}
    for _ in range(steps):
        opt.zero_grad()
        if runner is None:
            loss = forward_loss(modules[0], b)
            loss.backward()
        else:
            x_in, cond = _net_inputs(b)
            loss, _ = runner.step(x_in, lambda o, idx: per_sample_loss(o, b, idx).sum() / n,
                                  timesteps=b["c_noise"], **cond)
            loss = runner.broadcast_loss(loss, device)
            runner.sync_duplicated_grads()
        for m in modules:
            sync_grads(m, pmesh, tp_partial=P.tp_partial)
        res["grads"].append(_collect(modules, "grad"))
        res["norm"].append(clip_grad_norm_(modules, max_norm, pmesh, pp_duplicated=P.pp_duplicated).item())
        loss = loss.detach().float().clone()
        dist.all_reduce(loss, group=pmesh.group("dp"))
        res["loss"].append(loss.item() / dp)
        opt.step()
    return res


def merge_ranks(results: list[dict]) -> dict:
    """Combine per-rank results (pipeline ranks hold different parameters) into one."""
    merged = {"loss": results[0]["loss"], "norm": results[0]["norm"], "params": {},
              "grads": [{} for _ in results[0]["grads"]]}
    for r in results:
        for n, t in r["params"].items():
            merged["params"].setdefault(n, t)
        for s, gs in enumerate(r["grads"]):
            for n, t in gs.items():
                merged["grads"][s].setdefault(n, t)
    return merged


def compare(ref: dict, got: dict) -> dict:
    """Max relative errors of losses, norms, gradients (over all steps) and final weights."""
    def rel(a, b):
        return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()

    missing = set(ref["params"]) - set(got["params"])
    if missing:
        raise AssertionError(f"parameters missing from the parallel run: {sorted(missing)[:5]}")
    return {
        "loss": max(abs(a - b) / abs(b) for a, b in zip(got["loss"], ref["loss"])),
        "norm": max(abs(a - b) / abs(b) for a, b in zip(got["norm"], ref["norm"])),
        "grads": max(rel(g[n], r[n]) for g, r in zip(got["grads"], ref["grads"]) for n in r),
        "params": max(rel(got["params"][n], ref["params"][n]) for n in ref["params"]),
    }
