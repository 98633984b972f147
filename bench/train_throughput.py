"""Single-GPU training throughput of a DiT: step time, samples/s, tokens/s, model TFLOP/s, MFU, memory.

    # one configuration
    python bench/train_throughput.py --flavor xl --original --latent 1x32x32 --batch 256 --compile \\
        --precision bf16 --out bench/results/train_xl.json
    # a named suite (several variants, one compact table, one JSON)
    python bench/train_throughput.py --suite 7b --out bench/results/train_7b.json
    # CPU smoke run (what the tests do)
    python bench/train_throughput.py --device cpu --tiny

A step is what training does: diffusion loss (flow matching by default) forward, backward, AdamW
(fused) and an EMA update. FLOPs come from ``nemo_vfm/models/flops.py`` (matmuls + attention, 3x forward,
recomputation not counted); MFU is against the device's dense bf16 peak in the same module (the step log's);
the step time is ``bench.harness.step_time`` of the timed steps.
Speed knobs: ``--precision`` (``fp32``; ``amp`` = fp32 weights + bf16 autocast; ``bf16`` = bf16
weights and activations with fp32 master weights in the optimizer), ``--compile`` (per block, via
``nemo_vfm.parallel.compile``), ``--ac`` (activation checkpointing, via
``nemo_vfm.parallel.activation_checkpoint``), ``--sdpa`` (attention backend), ``--optimizer none``
(forward + backward only: the per-GPU compute of a sharded run whose optimizer state does not fit),
``--float8 rowwise|tensorwise`` (FP8 linears through torchao, ``nemo_vfm.parallel.float8``; reported
separately from bf16), ``--compile-mode`` (e.g. ``max-autotune-no-cudagraphs``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import device_peak, environment, step_time, write_json  # noqa: E402
from nemo_vfm.models.flops import dit_forward_flops  # noqa: E402

PRECISIONS = ("fp32", "amp", "bf16")
SDPA = ("auto", "cudnn", "flash", "efficient", "math")
OPTIMIZERS = ("adamw", "none")
SUITES = ("xl", "7b", "packed", "xl-fp8", "7b-fp8")


@dataclass(kw_only=True)
class BenchSettings:
    """One benchmark configuration. ``latent`` is ``(T, H, W)`` of one sample's latent; ``packed`` lists
    segments as ``(count, T, H, W)`` packed into one THD sequence per step (then ``batch`` is ignored)."""

    name: str = "run"
    flavor: str = "xl"
    original: bool = False  # original DiT: class-conditional, 4 channels, 2D sin-cos, learned sigma
    layers: int | None = None  # override the flavor's depth
    latent: tuple[int, int, int] = (1, 32, 32)
    batch: int = 256
    packed: tuple[tuple[int, int, int, int], ...] | None = None
    in_channels: int = 16
    context_dim: int = 4096
    text_len: int = 512
    precision: str = "bf16"
    compile: bool = True
    compile_mode: str | None = None  # torch.compile mode, e.g. "max-autotune-no-cudagraphs"
    float8: str | None = None  # "rowwise" | "tensorwise": FP8 linears via torchao (nemo_vfm.parallel.float8)
    float8_modules: str = "mlp"  # "mlp" | "all" (+ attention projections)
    ac: str = "none"
    sdpa: str = "auto"
    optimizer: str = "adamw"
    fuse_qkv: bool = False  # one GEMM for q, k, v (SelfAttention.fuse_qkv)
    ema: bool = True
    steps: int = 10
    warmup: int = 4
    profile: bool = False

    def __post_init__(self):
        self.latent = tuple(self.latent)
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.sdpa not in SDPA:
            raise ValueError(f"sdpa must be one of {SDPA}, got {self.sdpa!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.steps < 1 or self.warmup < 0 or self.batch < 1:
            raise ValueError("steps and batch must be >= 1 and warmup >= 0")
        if self.compile_mode and not self.compile:
            raise ValueError("compile_mode needs compile=True (drop --no-compile)")
        if self.packed is not None and self.original:
            raise ValueError("packed batches need a text-conditioned config: drop --original")
        from nemo_vfm.parallel.float8 import check_float8

        check_float8(self.float8, self.float8_modules)

    def model_config(self):
        from nemo_vfm.models.dit.flavors import dit_config, original_dit_config

        extra = {} if self.layers is None else {"num_layers": self.layers}
        if self.original:
            return original_dit_config(self.flavor, **extra)
        return dit_config(self.flavor, in_channels=self.in_channels, context_dim=self.context_dim, **extra)


# --------------------------------------------------------------------------------------------------
# inputs


def _tokens(cfg, t: int, h: int, w: int) -> int:
    pt, ph, pw = cfg.patch_size
    return (t // pt) * (h // ph) * (w // pw)


def make_inputs(s: BenchSettings, cfg, device) -> tuple[dict, list[int], list[int]]:
    """Random inputs for one step -> (inputs, video tokens per sample, text tokens per sample)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    if s.packed is not None:
        from nemo_vfm.data.batch import TokenSample, patchify
        from nemo_vfm.data.packing import pack_samples
        from nemo_vfm.models.common.packed import packed_seqs

        samples = []
        for count, t, h, w in s.packed:
            for i in range(count):
                tok, pos = patchify(torch.randn(cfg.in_channels, t, h, w, generator=g), cfg.patch_size)
                samples.append(TokenSample(key=f"{t}x{h}x{w}-{i}", tokens=tok, pos_ids=pos,
                                           loss_mask=torch.ones(tok.shape[0]),
                                           text=torch.randn(s.text_len, cfg.context_dim, generator=g),
                                           latent_shape=(cfg.in_channels, t, h, w), patch_size=cfg.patch_size,
                                           fps=24.0, num_real_tokens=tok.shape[0]))
        batch = pack_samples(samples).to(device)
        seqs = packed_seqs(batch)  # built once: the host-side segment bookkeeping is data-loader work
        lens = batch.seq_lens.tolist()
        return {"packed": batch, "seqs": seqs}, lens, [s.text_len] * len(lens)
    t, h, w = s.latent
    x0 = torch.randn(s.batch, cfg.in_channels, t, h, w, generator=g).to(device)
    cond = {}
    if cfg.num_classes > 0:
        cond["class_labels"] = torch.randint(0, cfg.num_classes, (s.batch,), generator=g).to(device)
    if cfg.context_dim is not None:
        cond["context"] = torch.randn(s.batch, s.text_len, cfg.context_dim, generator=g).to(device)
        valid = torch.randint(s.text_len // 4, s.text_len + 1, (s.batch,), generator=g)
        cond["context_mask"] = (torch.arange(s.text_len)[None] < valid[:, None]).to(device)
    return {"x0": x0, "cond": cond}, [_tokens(cfg, t, h, w)] * s.batch, [s.text_len] * s.batch


# --------------------------------------------------------------------------------------------------
# speed knobs


def set_sdpa_backend(name: str) -> None:
    """Global SDPA backend flags (read when a graph is traced, so set them before compiling): the library's
    ``select_sdpa_backend``, except that ``auto`` here leaves every kernel enabled (PyTorch's own choice)."""
    from nemo_vfm.parallel.sdpa_backend import select_sdpa_backend

    select_sdpa_backend("default" if name == "auto" else name)


class MasterWeights:
    """bf16 model weights, fp32 master copies updated by fused AdamW, bf16 weights refreshed after each step."""

    def __init__(self, params: list[torch.nn.Parameter], make_opt):
        self.params = params
        self.master = [p.detach().float().clone() for p in params]
        for p in params:
            p.data = p.data.to(torch.bfloat16)
        self.opt = make_opt(self.master)

    def step(self):
        for m, p in zip(self.master, self.params):
            m.grad = None if p.grad is None else p.grad.float()  # None: a weight no output reads (AdamW skips it)
        self.opt.step()
        with torch.no_grad():
            torch._foreach_copy_([p.data for p in self.params], self.master)

    def zero_grad(self):
        for p in self.params:
            p.grad = None
        for m in self.master:
            m.grad = None


def build_step(s: BenchSettings, device):
    """Model, inputs and a ``step()`` closure for ``s``; also the FLOP breakdown and token counts."""
    from nemo_vfm.diffusion.flow_matching import FlowMatching
    from nemo_vfm.diffusion.packed import packed_training_loss
    from nemo_vfm.parallel.activation_checkpoint import apply_activation_checkpointing
    from nemo_vfm.parallel.compile import compile_blocks

    cfg = s.model_config()
    model = cfg.build(device=device).train()
    if device.type == "cuda":
        set_sdpa_backend(s.sdpa)
    for block in model.blocks:
        block.attn.fuse_qkv = s.fuse_qkv
    if s.float8:
        from nemo_vfm.parallel.float8 import apply_float8

        apply_float8(model.blocks, s.float8, s.float8_modules)
    apply_activation_checkpointing(model.blocks, s.ac)
    if s.compile:
        compile_blocks(model.blocks, mode=s.compile_mode)
    params = [p for p in model.parameters() if p.requires_grad]
    fused = device.type == "cuda"

    def adamw(ps):
        return torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.0, fused=fused)

    opt = master = None
    if s.precision == "bf16":
        if s.optimizer == "adamw":
            master = MasterWeights(params, adamw)
        else:
            for p in params:
                p.data = p.data.to(torch.bfloat16)
    elif s.optimizer == "adamw":
        opt = adamw(params)
    ema = None
    if s.ema and s.optimizer == "adamw":
        src = master.master if master is not None else params
        ema = ([t.detach().clone() for t in src], src)

    inputs, seq_lens, text_lens = make_inputs(s, cfg, device)
    objective = FlowMatching()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.precision != "fp32")

    def step():
        with autocast:
            if s.packed is not None:
                batch = inputs["packed"]

                def net(x, t, **cond):
                    return model(x, t, context=cond["context"], fps=cond["fps"], packed=inputs["seqs"])

                loss, _ = packed_training_loss(objective, net, batch)
            else:
                loss, _ = objective.training_loss(model, inputs["x0"], inputs["cond"])
        loss.backward()
        if master is not None:
            master.step()
            master.zero_grad()
        elif opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            for p in params:
                p.grad = None
        if ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(ema[0], ema[1], 1 - 0.9999)
        return loss

    flops = dit_forward_flops(cfg, seq_lens, text_lens if cfg.context_dim is not None else None)
    return model, step, flops, seq_lens


# --------------------------------------------------------------------------------------------------
# timing


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(step, steps: int, warmup: int, device) -> tuple[list[float], list[float]]:
    """Seconds per step of ``steps`` steps after ``warmup`` untimed ones (CUDA events on GPU), and the
    losses of every step (read after the timing, so that no step waits for the host)."""
    losses = [step().detach() for _ in range(warmup)]
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        ev[0].record()
        for i in range(steps):
            losses.append(step().detach())
            ev[i + 1].record()
        torch.cuda.synchronize()
        return [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(steps)], [float(v) for v in losses]
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        losses.append(step().detach())
        out.append(time.perf_counter() - t0)
    return out, [float(v) for v in losses]


def kernel_profile(step, device, top: int = 15) -> dict:
    """Top CUDA kernels over 2 profiled steps and the time split (matmul / attention / fused element-wise / other)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(2):
            step()
        _sync(device)
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if (dev_us > 0 and e.device_type is not None and "cuda" in str(e.device_type).lower()
                and not is_annotation(e)):
            rows.append((e.key, dev_us / 2e3, e.count // 2))
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows) or 1.0

    def kind(name: str) -> str:
        n = name.lower()
        if any(k in n for k in ("flash", "fmha", "cudnn", "attention", "attn")):
            return "attention"
        if any(k in n for k in ("gemm", "sm90_xmma", "cutlass", "matmul", "nvjet", "cublas")):
            return "matmul"
        if n.startswith("triton") or "triton" in n:
            return "triton (fused element-wise)"
        if "adam" in n or "foreach" in n or "lerp" in n:
            return "optimizer + ema"
        return "other"

    split: dict[str, float] = {}
    for name, ms, _ in rows:
        split[kind(name)] = split.get(kind(name), 0.0) + ms
    return {"device_ms_per_step": total, "split_ms": {k: round(v, 2) for k, v in sorted(split.items())},
            "top_kernels": [{"name": n[:120], "ms_per_step": round(ms, 3), "calls_per_step": c,
                             "share": round(ms / total, 4)} for n, ms, c in rows[:top]]}


def is_annotation(event) -> bool:
    """A profiler range (``Optimizer.step#AdamW.step``, ``record_function``) that torch also lists on the GPU
    timeline: it spans kernels counted on their own, so adding it counts them twice."""
    return bool(getattr(event, "is_user_annotation", False)) or "#" in event.key


def run_case(s: BenchSettings, device: torch.device) -> dict:
    """Build, warm up, time and (optionally) profile one configuration -> a result dict."""
    res = {"name": s.name, "settings": dataclasses.asdict(s)}
    torch.manual_seed(0)
    try:
        model, step, flops, seq_lens = build_step(s, device)
        t_build = time.perf_counter()
        times, losses = time_steps(step, s.steps, s.warmup, device)
        res["warmup_s"] = round(time.perf_counter() - t_build - sum(times), 2)
        if not all(map(math.isfinite, losses)):  # a broken step can look fast: never report its speed
            raise FloatingPointError(f"non-finite losses {losses}")
        dt = step_time(times)
        samples, tokens = len(seq_lens), sum(seq_lens)
        tflops = flops.train_step / dt / 1e12
        peak = device_peak(device)
        res.update({
            "step_s": dt, "step_s_min": min(times), "step_s_max": max(times),
            "samples_per_s": samples / dt, "tokens_per_s": tokens / dt, "tokens_per_step": tokens,
            "samples_per_step": samples, "train_flops_per_step": flops.train_step,
            "attention_flop_share": flops.attention / flops.forward, "model_tflops": tflops,
            "mfu": tflops / peak if peak else None, "params": sum(p.numel() for p in model.parameters()),
        })
        if device.type == "cuda":
            res["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        if s.profile:
            res["profile"] = kernel_profile(step, device)
    except Exception as e:  # noqa: BLE001  one variant failing (e.g. out of memory) is a result, not a crash
        import traceback

        traceback.print_exc()
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    finally:
        model = step = None
        if device.type == "cuda":
            from torch import _dynamo

            _dynamo.reset()
            torch.cuda.empty_cache()
    return res


# --------------------------------------------------------------------------------------------------
# suites, table, JSON


def suite(name: str) -> list[BenchSettings]:
    """Named sets of variants run in one process (one device call)."""
    if name == "xl":  # original DiT-XL/2 at 256 px; batch 256 does not fit 80 GB without checkpointing
        base = dict(flavor="xl", original=True, latent=(1, 32, 32), batch=128, sdpa="cudnn")
        return [BenchSettings(name="xl-bs128-bf16-cudnn", **base, profile=True),
                BenchSettings(name="xl-bs128-bf16-cudnn-fqkv", **base, fuse_qkv=True),
                BenchSettings(name="xl-bs128-amp-cudnn-fqkv", **base, precision="amp", fuse_qkv=True),
                BenchSettings(name="xl-bs128-bf16-flash-fqkv", **{**base, "sdpa": "flash"}, fuse_qkv=True),
                BenchSettings(name="xl-bs176-bf16-cudnn-fqkv", **{**base, "batch": 176}, fuse_qkv=True)]
    if name == "7b":  # 8 x 64 x 64 latent at patch (1, 2, 2) = 8192 tokens; 512 text tokens
        base = dict(flavor="7b", latent=(8, 64, 64), batch=1, text_len=512, warmup=3, steps=6)
        return [BenchSettings(name="7b-fwdbwd-cudnn", **base, optimizer="none", sdpa="cudnn", profile=True),
                BenchSettings(name="7b-4layers-full-step", **{**base, "layers": 4}, sdpa="cudnn"),
                BenchSettings(name="7b-fwdbwd-flash", **base, optimizer="none", sdpa="flash")]
    if name == "packed":  # same 8192 tokens: one 8-frame video vs 2 videos + 2 images, XL width, text 128
        base = dict(flavor="xl", text_len=128, warmup=4, steps=10, sdpa="cudnn")
        mix = ((1, 4, 64, 64), (1, 2, 64, 64), (2, 1, 64, 64))
        return [BenchSettings(name="packed-8192", **base, packed=mix),
                BenchSettings(name="unpacked-8192", **base, latent=(8, 64, 64), batch=1),
                BenchSettings(name="packed-8192-eager", **base, packed=mix, compile=False),
                BenchSettings(name="unpacked-8192-eager", **base, latent=(8, 64, 64), batch=1, compile=False)]
    if name == "xl-fp8":  # DiT-XL/2 speed knobs beyond bf16: FP8 linears, autotuned compile
        base = dict(flavor="xl", original=True, latent=(1, 32, 32), batch=176, sdpa="cudnn", precision="amp",
                    fuse_qkv=True)
        return [BenchSettings(name="xl-bs176-amp", **base),
                BenchSettings(name="xl-bs176-amp-fp8row-mlp", **base, float8="rowwise"),
                BenchSettings(name="xl-bs176-amp-fp8tw-mlp", **base, float8="tensorwise"),
                BenchSettings(name="xl-bs176-amp-fp8row-all", **base, float8="rowwise", float8_modules="all"),
                BenchSettings(name="xl-bs176-amp-fp8tw-all", **base, float8="tensorwise", float8_modules="all",
                              profile=True),
                BenchSettings(name="xl-bs176-amp-autotune", **base, compile_mode="max-autotune-no-cudagraphs")]
    if name == "7b-fp8":  # DiT-7B forward + backward at 8192 tokens with FP8 linears
        base = dict(flavor="7b", latent=(8, 64, 64), batch=1, text_len=512, warmup=3, steps=6, optimizer="none",
                    sdpa="cudnn")
        return [BenchSettings(name="7b-fwdbwd-fp8row-all", **base, float8="rowwise", float8_modules="all"),
                BenchSettings(name="7b-fwdbwd-fp8tw-all", **base, float8="tensorwise", float8_modules="all")]
    raise ValueError(f"unknown suite {name!r}; choose one of: {', '.join(SUITES)}")


def table(results: list[dict]) -> str:
    head = f"{'name':28} {'step ms':>8} {'samples/s':>10} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'mem GiB':>8}"
    lines = [head]
    for r in results:
        if "error" in r:
            lines.append(f"{r['name']:28} ERROR {r['error'][:80]}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        mem = f"{r['peak_mem_gib']:.1f}" if "peak_mem_gib" in r else "-"
        lines.append(f"{r['name']:28} {1e3 * r['step_s']:8.1f} {r['samples_per_s']:10.1f} {r['tokens_per_s']:10.0f} "
                     f"{r['model_tflops']:8.1f} {mfu:>6} {mem:>8}")
    return "\n".join(lines)


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.lower().split("x"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", choices=SUITES, help="run a named set of variants")
    p.add_argument("--tiny", action="store_true", help="tiny model, small latent, 2 steps (CPU smoke run)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--flavor", default="xl")
    p.add_argument("--original", action="store_true", help="original class-conditional DiT config")
    p.add_argument("--layers", type=int)
    p.add_argument("--latent", type=_shape, default=(1, 32, 32), help="T x H x W of one latent, e.g. 8x64x64")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--packed", type=lambda t: tuple(_shape(v) for v in t.split(",")),
                   help="segments as COUNTxTxHxW,..., e.g. 1x4x64x64,2x1x64x64")
    p.add_argument("--text-len", type=int, default=512)
    p.add_argument("--precision", choices=PRECISIONS, default="bf16")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--compile-mode", help="torch.compile mode, e.g. max-autotune-no-cudagraphs")
    p.add_argument("--float8", choices=("rowwise", "tensorwise"), help="FP8 linears (torchao)")
    p.add_argument("--float8-modules", choices=("mlp", "all"), default="mlp")
    p.add_argument("--ac", default="none", help="none | full | selective | selective_op")
    p.add_argument("--sdpa", choices=SDPA, default="auto")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--fuse-qkv", action="store_true", help="one GEMM for q, k, v")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--profile", action="store_true", help="add top kernels and the time split")
    p.add_argument("--commit", help="commit to record (default: git rev-parse HEAD)")
    p.add_argument("--out", help="JSON file for the results")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: pass --device cpu (with --tiny for a smoke run)")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if a.suite:
        cases = suite(a.suite)
    elif a.tiny:
        cases = [BenchSettings(name="tiny", flavor="tiny", latent=(2, 8, 8), batch=2, text_len=8, context_dim=32,
                               in_channels=4, precision="fp32", compile=False, steps=2, warmup=1, profile=a.profile,
                               packed=a.packed, float8=a.float8, float8_modules=a.float8_modules)]
    else:
        cases = [BenchSettings(name=a.flavor, flavor=a.flavor, original=a.original, layers=a.layers, latent=a.latent,
                               batch=a.batch, packed=a.packed, text_len=a.text_len, precision=a.precision,
                               compile=a.compile, compile_mode=a.compile_mode, float8=a.float8,
                               float8_modules=a.float8_modules, ac=a.ac, sdpa=a.sdpa, optimizer=a.optimizer,
                               fuse_qkv=a.fuse_qkv, steps=a.steps, warmup=a.warmup, profile=a.profile)]
    env = environment(device, a.commit)
    results = []
    for c in cases:
        results.append(run_case(c, device))
        print(table(results[-1:]).splitlines()[-1], flush=True)
        if a.out:
            write_json(a.out, env, results)
    print(f"\n{env['device']}  torch {env['torch']}  {env['date']}  commit {env['commit']}")
    print(table(results))
    for r in results:
        if "profile" in r:
            print(f"\n{r['name']}: time split (ms/step) {r['profile']['split_ms']}")
            for k in r["profile"]["top_kernels"][:8]:
                print(f"  {k['ms_per_step']:8.2f} ms  {100 * k['share']:5.1f}%  x{k['calls_per_step']:<4} {k['name'][:90]}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
