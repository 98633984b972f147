"""Wan 2.1 step time against diffusers' ``WanTransformer3DModel`` on the same GPU, random weights, bf16.

    # full fine-tune step of Wan-1.3B at 480p x 81 frames (latent 21x60x104 = 32,760 tokens), and diffusers'
    python bench/wan_step.py --mode full --out bench/results/wan_1_3b_full_h100.json
    # the denoising step of vfm generate (CFG: conditional + unconditional) against diffusers' two transformer calls
    python bench/wan_step.py --mode infer --out bench/results/wan_1_3b_infer_h100.json
    # LoRA (rank 32 on every attention and FFN linear) step of Wan-1.3B: ours vs diffusers + peft (gradient checkpointing)
    python bench/wan_step.py --mode lora --out bench/results/wan_1_3b_lora_h100.json
    # Wan-14B LoRA on one 80 GB GPU, no FSDP: frozen bf16 base, the recipe's checkpointing (memory and s/step)
    python bench/wan_step.py --mode lora --model t2v_14b --cases ours --steps 5 --warmup 2 \
        --out bench/results/wan_14b_lora_h100.json
    # sliding tile attention in ours (vfm generate --attention sta; lora_wan_1_3b_sparse), diffusers dense
    python bench/wan_step.py --mode infer --attention sta --attention-window 3x3x3 --out bench/results/wan_sta_infer.json
    # CPU smoke run (what the tests do)
    python bench/wan_step.py --device cpu --tiny --mode full

Modes (``MODES``; one function per mode returns ``{case: step closure}`` for ours and diffusers'). Our cases run
what users run: on CUDA the blocks are compiled (the recipes' ``compile="auto"``, ``vfm generate``'s default for
Wan) and training uses the recipes' activation checkpointing (``RECIPE_AC``: ``save_attention``, every block
recomputed in backward except its self-attention; ``--ac`` overrides).

* ``full``: flow-matching loss (Wan's objective), forward, backward and AdamW over all parameters (bf16 weights,
  fp32 master weights, fused AdamW) for both. Ours: compiled blocks (``nemo_vfm.parallel.compile``) with
  activation checkpointing ``--ac`` (at 32,760 tokens the un-checkpointed activations of 30 blocks exceed
  80 GB); diffusers: ``enable_gradient_checkpointing()``, its usual training setting.
* ``lora``: LoRA fine-tune step (``--lora-rank``/``--lora-alpha`` on every attention and FFN linear; frozen bf16
  base, adapters with fp32 master weights and fused AdamW). Ours: ``nemo_vfm.models.common.lora`` adapters,
  compiled blocks, ``--ac``; diffusers: peft adapters (``add_adapter``) on the same linears with
  ``enable_gradient_checkpointing()``. ``--model t2v_14b --cases ours``: the 14B LoRA step on one GPU.
* ``infer``: one classifier-free-guided denoising step as ``vfm generate`` runs it (``InferenceEngine`` network
  with its cuDNN attention and compiled blocks, conditional and unconditional in one batch of 2; ``--no-compile``
  = ``vfm generate --no-compile``) against diffusers' ``WanPipeline`` step (two transformer calls of batch 1),
  no autograd.

Writes JSON: device, date, commit, per case ms/step (median), warm-up seconds (compilation included), peak memory,
with ``--profile`` the top CUDA kernels, and ours/diffusers' speed ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import environment, step_time  # noqa: E402
from bench.train_throughput import MasterWeights, kernel_profile, set_sdpa_backend, time_steps  # noqa: E402

LATENT = (21, 60, 104)  # 480x832 px, 81 frames through the Wan VAE (4x temporal, 8x spatial)
TINY_LATENT = (2, 4, 4)
# The activation checkpointing of the recipes (recipes/finetune.py: finetune_wan_1_3b, lora_wan_1_3b,
# lora_wan_14b), the default of --ac here; tests/bench/test_wan_step.py checks that they agree.
RECIPE_AC = {("full", "t2v_1_3b"): "save_attention", ("lora", "t2v_1_3b"): "save_attention",
             ("lora", "t2v_14b"): "save_attention"}


def wan_config(tiny: bool, model: str = "t2v_1_3b", attention: str = "dense", window: str = "3x3x3",
               tile: str = "4x8x4"):
    """The flavor's config; ``attention="sta"``: our sliding tile attention (``window`` / ``tile`` as TxHxW)."""
    from nemo_vfm.models.wan.flavors import wan_config as flavor

    sparse = {} if attention == "dense" else dict(attention=attention, attention_window=_txhxw(window),
                                                  attention_tile=_txhxw(tile))
    return flavor("tiny", **sparse) if tiny else flavor(model, **sparse)


def _txhxw(text: str) -> tuple[int, int, int]:
    return tuple(int(v) for v in text.lower().split("x"))


def make_inputs(cfg, latent, batch: int, device, dtype, seed: int = 0) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)
    x0 = torch.randn(batch, cfg.out_channels, *latent, generator=g).to(device, dtype)
    ctx = torch.randn(batch, cfg.text_len, cfg.context_dim, generator=g).to(device, dtype)
    neg = torch.randn(batch, cfg.text_len, cfg.context_dim, generator=g).to(device, dtype)
    return {"x0": x0, "context": ctx, "negative": neg}


def _diffusers_model(cfg, device, dtype):
    from diffusers import WanTransformer3DModel

    from nemo_vfm.models.wan.convert import config_to_diffusers

    torch.manual_seed(0)
    return WanTransformer3DModel(**config_to_diffusers(cfg)).to(device, dtype)


def _ours(cfg, device, dtype):
    torch.manual_seed(0)
    return cfg.build(device=device).to(dtype)


def _adamw(device):
    return lambda ps: torch.optim.AdamW(ps, lr=1e-5, weight_decay=0.0, fused=device.type == "cuda")


# -- modes ---------------------------------------------------------------------------------------------
def full_cases(a, cfg, device) -> dict:
    """Full fine-tune steps: {"ours": step, "diffusers": step}."""
    from nemo_vfm.models.wan.flavors import wan_objective
    from nemo_vfm.parallel.activation_checkpoint import apply_activation_checkpointing
    from nemo_vfm.parallel.compile import compile_blocks

    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    objective = wan_objective("t2v_1_3b")
    inp = make_inputs(cfg, a.latent, a.batch, device, dtype)

    def ours():
        model = _ours(cfg, device, torch.float32).train()
        apply_activation_checkpointing(model.blocks, a.ac, a.ac_every)
        if a.compile:
            compile_blocks(model.blocks)
        opt = MasterWeights([p for p in model.parameters()], _adamw(device)) if dtype == torch.bfloat16 else None
        plain = torch.optim.AdamW(model.parameters(), lr=1e-5) if opt is None else None
        cond = {"context": inp["context"]}

        def step():
            loss, _ = objective.training_loss(model, inp["x0"], cond)
            loss.backward()
            (opt or plain).step()
            (opt or plain).zero_grad()
            return loss

        return step

    def theirs():
        model = _diffusers_model(cfg, device, torch.float32).train()
        model.enable_gradient_checkpointing()
        opt = MasterWeights([p for p in model.parameters()], _adamw(device)) if dtype == torch.bfloat16 else None
        plain = torch.optim.AdamW(model.parameters(), lr=1e-5) if opt is None else None

        def net(x, t, context):
            return model(x, t * 1000, context, return_dict=False)[0]

        def step():
            loss, _ = objective.training_loss(net, inp["x0"], {"context": inp["context"]})
            loss.backward()
            (opt or plain).step()
            (opt or plain).zero_grad()
            return loss

        return step

    return {"ours": ours, "diffusers": theirs}


def infer_cases(a, cfg, device) -> dict:
    """One CFG denoising step: {"ours": step, "diffusers": step}."""
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.sampling import guided_predictor, predictor
    from nemo_vfm.models.wan.flavors import wan_objective

    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    objective = wan_objective("t2v_1_3b")
    inp = make_inputs(cfg, a.latent, a.batch, device, dtype)
    t = torch.full((a.batch,), 0.7, device=device)
    guidance = 5.0

    def ours():
        engine = InferenceEngine.from_model(_ours(cfg, device, dtype), objective, device=device, dtype=a.precision,
                                            compile=a.compile)  # = vfm generate --compile
        cond = {"context": inp["context"]}
        uncond = {"context": inp["negative"]}
        g = guided_predictor(predictor(objective, engine.net, dtype), cond, uncond, guidance)

        @torch.no_grad()
        def step():
            return g(inp["x0"], t).float().mean()  # a scalar for the harness (read after the timing)

        return step

    def theirs():
        model = _diffusers_model(cfg, device, dtype).eval()

        @torch.no_grad()
        def step():  # WanPipeline: two calls, then the guidance combination
            pc = model(inp["x0"], t * 1000, inp["context"], return_dict=False)[0]
            pu = model(inp["x0"], t * 1000, inp["negative"], return_dict=False)[0]
            return (pu + guidance * (pc - pu)).float().mean()

        return step

    return {"ours": ours, "diffusers": theirs}


# LoRA targets: every attention and FFN linear of a block, in our names and in diffusers' (peft suffix match)
LORA_TARGETS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.k",
                "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")
PEFT_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]


def ours_lora_model(cfg, device, dtype, rank: int, alpha: float):
    """Our Wan with LoRA adapters: built on the meta device in ``dtype``, allocated once on ``device`` (a 14B
    model never exists in fp32 there), initialised, adapted; the base is frozen."""
    from nemo_vfm.models.common.lora import LoRAConfig, apply_lora

    torch.manual_seed(0)
    model = cfg.build("meta").to(dtype)
    model.to_empty(device=device)
    model.init_weights()
    apply_lora(model, LoRAConfig(rank=rank, alpha=alpha, targets=LORA_TARGETS))
    return model


def lora_cases(a, cfg, device) -> dict:
    """LoRA fine-tune steps (frozen bf16 base, adapters with fp32 master weights and fused AdamW):
    {"ours": step, "diffusers": step}; diffusers' model gets peft adapters (``add_adapter``) on the same linears
    and gradient checkpointing, as diffusers' Wan LoRA training scripts run it."""
    from nemo_vfm.models.wan.flavors import wan_objective
    from nemo_vfm.parallel.activation_checkpoint import apply_activation_checkpointing
    from nemo_vfm.parallel.compile import compile_blocks

    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    objective = wan_objective("t2v_1_3b")
    inp = make_inputs(cfg, a.latent, a.batch, device, dtype)

    def optimizer(model):
        trainable = [p for p in model.parameters() if p.requires_grad]
        if dtype == torch.bfloat16:
            return MasterWeights(trainable, _adamw(device)), trainable
        return torch.optim.AdamW(trainable, lr=1e-4), trainable

    def make_step(net, opt):
        def step():
            loss, _ = objective.training_loss(net, inp["x0"], {"context": inp["context"]})
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        return step

    def ours():
        model = ours_lora_model(cfg, device, dtype, a.lora_rank, a.lora_alpha).train()
        apply_activation_checkpointing(model.blocks, a.ac, a.ac_every)
        if a.compile:
            compile_blocks(model.blocks)
        opt, trainable = optimizer(model)
        a.trainable_params = sum(p.numel() for p in trainable)
        return make_step(model, opt)

    def theirs():
        from peft import LoraConfig

        model = _diffusers_model(cfg, device, dtype).train()
        model.requires_grad_(False)
        model.add_adapter(LoraConfig(r=a.lora_rank, lora_alpha=a.lora_alpha, init_lora_weights=True,
                                     target_modules=PEFT_TARGETS))
        model.enable_gradient_checkpointing()
        opt, trainable = optimizer(model)
        a.trainable_params_diffusers = sum(p.numel() for p in trainable)

        def net(x, t, context):
            return model(x, t * 1000, context, return_dict=False)[0]

        return make_step(net, opt)

    return {"ours": ours, "diffusers": theirs}


MODES = {"full": full_cases, "infer": infer_cases, "lora": lora_cases}


def run(a, device) -> dict:
    cfg = wan_config(a.tiny, a.model, a.attention, a.attention_window, a.attention_tile)
    cases = MODES[a.mode](a, cfg, device)
    out = {}
    for name in a.cases:
        step = cases[name]()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        times, losses = time_steps(step, a.steps, a.warmup, device)
        vals = [v for v in losses if v == v]
        out[name] = {"ms": 1e3 * step_time(times), "ms_all": [1e3 * x for x in times],
                     "warmup_s": round(time.perf_counter() - t0 - sum(times), 1),  # compilation included
                     "peak_mem_gib": (torch.cuda.max_memory_allocated() / 2**30) if device.type == "cuda" else None}
        if a.mode != "infer" and (len(vals) != len(losses) or not all(abs(v) < 1e6 for v in vals)):
            raise RuntimeError(f"{name}: non-finite loss {losses}")
        if a.profile:
            out[name]["profile"] = kernel_profile(step, device, top=25)
        del step
    if "ours" in out and "diffusers" in out:
        out["ratio"] = out["diffusers"]["ms"] / out["ours"]["ms"]  # > 1: ours is faster
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default="full", choices=sorted(MODES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="a tiny Wan and latent (CPU smoke run)")
    p.add_argument("--model", default="t2v_1_3b", choices=("t2v_1_3b", "t2v_14b"),
                   help="Wan flavor (t2v_14b: --mode lora --cases ours, one GPU)")
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--lora-alpha", type=float, default=32.0)
    p.add_argument("--latent", default=None, help="T,H,W of the latent (default 21,60,104; --tiny: 2,4,4)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="compile our blocks (default: on CUDA, as the recipes train and vfm generate samples Wan there)")
    p.add_argument("--ac", default=None, help="our activation checkpointing in full and lora modes (none, full, "
                                              "save_attention, selective, selective_op; default: the recipe's, "
                                              "RECIPE_AC)")
    p.add_argument("--profile", action="store_true", help="also record the top CUDA kernels of 2 steps per case")
    p.add_argument("--ac-every", type=int, default=2)
    p.add_argument("--sdpa", default="cudnn", help="SDPA backend for both (auto, cudnn, flash, efficient, math)")
    p.add_argument("--attention", default="dense", choices=("dense", "sta"),
                   help="our self-attention (sta: sliding tile attention, as vfm generate --attention sta and "
                        "lora_wan_1_3b_sparse); diffusers' stays dense")
    p.add_argument("--attention-window", default="3x3x3", help="sta: key tiles around each query tile (TxHxW)")
    p.add_argument("--attention-tile", default="4x8x4", help="sta: latent tokens per tile (TxHxW)")
    p.add_argument("--cases", default="ours,diffusers", help="which to run (comma list)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--commit")
    p.add_argument("--out", help="write the JSON here")
    a = p.parse_args(argv)
    a.latent = tuple(int(v) for v in a.latent.replace("x", ",").split(",")) if a.latent else (
        TINY_LATENT if a.tiny else LATENT)
    a.cases = [c for c in a.cases.split(",") if c]
    if a.compile is None:
        a.compile = a.device != "cpu"
    if a.ac is None:
        a.ac = RECIPE_AC.get((a.mode, a.model), "full") if a.mode != "infer" else "none"
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda":
        set_sdpa_backend(a.sdpa)
    cfg = wan_config(a.tiny, a.model, a.attention, a.attention_window, a.attention_tile)
    tokens = 1
    for n, pt in zip(a.latent, cfg.patch_size):
        tokens *= n // pt
    result = {**environment(device, a.commit), "mode": a.mode, "model": "tiny" if a.tiny else a.model,
              "latent": list(a.latent), "tokens": tokens, "batch": a.batch, "precision": a.precision,
              "compile": a.compile, "ac": a.ac if a.mode != "infer" else None, "sdpa": a.sdpa,
              "attention": a.attention if a.attention == "dense" else
              f"{a.attention} window {a.attention_window} tile {a.attention_tile} (ours; diffusers dense)",
              "results": run(a, device)}
    if a.mode == "lora":
        result.update(lora_rank=a.lora_rank, lora_alpha=a.lora_alpha,
                      trainable_params=getattr(a, "trainable_params", None),
                      trainable_params_diffusers=getattr(a, "trainable_params_diffusers", None))
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
