"""Fine-tuning step of each model family through the user's command, beside diffusers (+ peft), same GPU, same run.

    # the rows of docs/models.md and docs/finetuning.md (one H100): Wan 2.2, Cosmos-Predict2.5, HunyuanVideo 1.5
    python bench/family_step.py --out bench/results/family_step_h100.json
    python bench/family_step.py --only cosmos2.5-2b-lora,cosmos2.5-2b-full --out /tmp/f.json
    python bench/family_step.py --only kandinsky6-3b-lora,ltx2-lora,ltx2-video-lora --out /tmp/f.json
    # CPU smoke run (what tests/bench does): tiny networks, a few steps
    python bench/family_step.py --device cpu --tiny --only wan2.2-ti2v-5b-lora --steps 4 --every 2 --out /tmp/f.json

Ours: ``launchers/train.py --factory F --yes model.pretrained=None data=mock data.num_frames=T data.height=H
data.width=W ...`` (``recipe_throughput.run_recipe``: a subprocess, the recipe's layout, checkpointing and compile
settings, random weights and latents; the figures are the run's ``perf.jsonl`` through ``bench.harness``). Theirs: the same architecture in
diffusers (our config converted by the family's ``config_to_diffusers``), random bf16 weights, the same latent and
text sizes, diffusers' ``enable_gradient_checkpointing()``; LoRA through peft (``add_adapter``) on the same linears
with the recipe's rank and alpha, full fine-tuning with fp32 master weights and fused AdamW (as ours); the loss is
rectified flow's velocity MSE. HunyuanVideo gets what its pipeline feeds at text-to-video: the ByT5 states (256
tokens, masked) and zero SigLIP tokens (729, masked). Kandinsky 6 Video (``lora_kandinsky6_3b``, the video stream) gets
what ``Kandinsky6TI2VAPipeline`` feeds at text-to-video with ``sample_audio=False``: the latents in its (B, T, H, W, C)
layout with the zero conditioning latent and mask channels (``visual_cond``), the Qwen2.5-VL states (1024 tokens, the
pipeline's padded length; no mask, as the pipeline passes for an unpadded prompt, and ours' mock mask is all True),
the CLIP pooled text (768) and ``1000 t``; no ``audio_hidden_states``, so its fused blocks run the video path only, as
ours (diffusers still runs the audio stream's text branch, 2 text blocks over the prompt: its cost, not ours). LTX-2
(``lora_ltx2``) gets what ``LTX2Pipeline`` feeds its transformer: the packed video tokens (B, S, 128) and audio tokens
(B, La, 8 x 16) of the pipeline's default clip (512x768 px, 121 frames at 24 fps: 16x16x24 video latents, 126 audio
latent frames of 16 mel bins; ours' mock ``data.audio_shape`` is that (8, 126, 16)), the video and audio connectors'
outputs (1024 tokens of 3840 each, unmasked, as the connectors' registers leave them), ``timestep = sigma = 1000 t``
for both streams, and the loss is video MSE + audio MSE (ours' ``AudioVideoFlowMatching`` weights, 1.0 each). LTX-2 on
the video stream alone (``lora_ltx2_video``; ours does not run the audio stream): diffusers' forward needs audio, so it
gets one zero audio token and ``isolate_modalities=True`` (no audio-video cross attention), its audio output unused.
Random weights change neither memory nor speed.

Writes JSON (device, date, commit, command; per case ours and theirs: ms/step, peak GiB, ours' TFLOP/s and MFU) and a
Markdown table; ``ratio`` = diffusers ms / ours ms (> 1: ours is faster).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])


@dataclasses.dataclass(frozen=True)
class Case:
    """``factory`` trained on ``latent`` (T, H, W) random latents with ``text`` tokens (and ``audio`` latents);
    ``family``/``flavor`` name the architecture diffusers builds; ``lora`` (rank, alpha) or None for full fine-tuning;
    ``size`` says what it is."""

    factory: str
    family: str
    flavor: str
    latent: tuple[int, int, int]
    text: int
    lora: tuple[int, float] | None
    size: str
    overrides: tuple[str, ...] = ()
    audio: tuple[int, int, int] | None = None  # LTX-2: audio latents (channels, frames, mel bins) trained too


RANK32 = (32, 32.0)
CASES = {
    "wan2.2-ti2v-5b-lora": Case("lora_wan2_2_ti2v_5b", "wan", "ti2v_5b", (31, 44, 80), 512, RANK32,
                                "704x1280 px, 121 frames (27,280 tokens)"),
    "wan2.2-t2v-a14b-lora": Case("lora_wan2_2_t2v_a14b", "wan", "t2v_a14b", (21, 60, 104), 512, RANK32,
                                 "480x832 px, 81 frames (32,760 tokens), one expert"),
    "cosmos2.5-2b-lora": Case("lora_cosmos_predict2_5_2b", "cosmos", "predict2_5_2b", (24, 60, 104), 512, RANK32,
                              "480x832 px, 93 frames (37,440 tokens)"),
    "cosmos2.5-2b-full": Case("finetune_cosmos_predict2_5_2b", "cosmos", "predict2_5_2b", (24, 60, 104), 512, None,
                              "480x832 px, 93 frames (37,440 tokens)"),
    "hunyuan1.5-lora": Case("lora_hunyuanvideo_1_5", "hunyuan", "480p_t2v", (31, 30, 53), 256, RANK32,
                            "480x848 px, 121 frames (49,290 tokens)"),
    "wan1.3b-lora": Case("lora_wan_1_3b", "wan", "t2v_1_3b", (21, 60, 104), 512, RANK32,
                         "480x832 px, 81 frames (32,760 tokens)"),
    "wan1.3b-lora-sparse": Case("lora_wan_1_3b_sparse", "wan", "t2v_1_3b", (21, 60, 104), 512, RANK32,
                                "480x832 px, 81 frames (32,760 tokens); ours sparse (STA), diffusers dense"),
    # Kandinsky6TI2VAPipeline's default clip (512x768, 121 frames); the derived lite_3b layout (flavors.py)
    "kandinsky6-3b-lora": Case("lora_kandinsky6_3b", "kandinsky6", "lite_3b", (31, 64, 96), 1024, RANK32,
                               "512x768 px, 121 frames (47,616 tokens), video stream"),
    # LTX2Pipeline's default clip (512x768, 121 frames at 24 fps) with its audio (126 latent frames)
    "ltx2-lora": Case("lora_ltx2", "ltx2", "ltx2_19b", (16, 16, 24), 1024, RANK32,
                      "512x768 px, 121 frames (6,144 video + 126 audio tokens)", audio=(8, 126, 16)),
    "ltx2-video-lora": Case("lora_ltx2_video", "ltx2", "ltx2_19b", (16, 16, 24), 1024, RANK32,
                            "512x768 px, 121 frames (6,144 tokens), video stream only"),
}
DEFAULT = ("wan2.2-ti2v-5b-lora", "wan2.2-t2v-a14b-lora", "cosmos2.5-2b-lora", "cosmos2.5-2b-full", "hunyuan1.5-lora")
TINY_LATENT, TINY_TEXT, TINY_AUDIO_FRAMES = (3, 4, 4), 8, 5
_LTX2_ATTN = r"\.(to_q|to_k|to_v|to_out\.0)"
# peft targets (diffusers' module names) of the linears the recipes adapt: by family, or by factory where a family's
# recipes differ
PEFT_TARGETS = {
    "wan": ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"],
    "cosmos": r"transformer_blocks\.\d+\.(attn[12]\.(to_q|to_k|to_v|to_out\.0)|ff\.net\.(0\.proj|2))",
    "hunyuan": r"transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)"
               r"|ff\.net\.(0\.proj|2)|ff_context\.net\.(0\.proj|2))",
    "kandinsky6": r"visual_transformer_blocks\.\d+\.video_dec_block\.((self|cross)_attention\.(to_query|to_key|to_value"
                  r"|out_layer)|feed_forward\.net\.(0\.proj|2))",
    "ltx2": r"transformer_blocks\.\d+\.((attn1|attn2|audio_attn1|audio_attn2|audio_to_video_attn|video_to_audio_attn)"
            + _LTX2_ATTN + r"|(ff|audio_ff)\.net\.(0\.proj|2))",
    "lora_ltx2_video": r"transformer_blocks\.\d+\.((attn1|attn2)" + _LTX2_ATTN + r"|ff\.net\.(0\.proj|2))",
}


def peft_targets(case: Case):
    """``case``'s peft ``target_modules``: its factory's entry, else its family's."""
    return PEFT_TARGETS.get(case.factory, PEFT_TARGETS.get(case.family))


# -- what differs between families, as data ---------------------------------------------------------------------
# Each ``call`` is diffusers' forward of ``model`` as the family's pipeline calls it: ``x (B, C, T, H, W)``, ``t (B,)``
# in [0, 1], ``ctx (B, L, D)``, ``audio (B, Ca, La, M)`` or None, ``extra`` the inputs ``extra_inputs`` drew once;
# it returns the velocity (with LTX-2's audio: ``(velocity, audio velocity)``).
def _wan_call(model, cfg, case, x, t, ctx, audio, extra):
    B, _, T, H, W = x.shape
    pt, ph, pw = cfg.patch_size
    ts = t * 1000
    if case.flavor == "ti2v_5b":  # Wan 2.2 TI2V: per-token times (the first frame's clean tokens at 0)
        ts = ts[:, None].expand(B, (T // pt) * (H // ph) * (W // pw)).clone()
        ts[:, : (H // ph) * (W // pw)] = 0
    return model(x, ts, ctx, return_dict=False)[0]


def _cosmos_call(model, cfg, case, x, t, ctx, audio, extra):
    B, _, T, H, W = x.shape
    cond = x.new_zeros(B, 1, T, H, W)
    return model(x, t, ctx, condition_mask=cond, padding_mask=x.new_zeros(1, 1, H, W), return_dict=False)[0]


def _kandinsky6_call(model, cfg, case, x, t, ctx, audio, extra):
    """(B, T, H, W, C) latents with the zero conditioning latent and mask channels; the CLIP pooled text."""
    import torch

    h = x.permute(0, 2, 3, 4, 1)
    if cfg.visual_cond:
        h = torch.cat([h, h.new_zeros(*h.shape[:-1], cfg.in_channels + 1)], -1)
    out = model(hidden_states=h, encoder_hidden_states=ctx, pooled_projections=extra["pooled"].expand(x.shape[0], -1),
                timestep=t * 1000, return_dict=False)[0]  # fp32 times, as the pipeline
    return out.permute(0, 4, 1, 2, 3)


def _ltx2_call(model, cfg, case, x, t, ctx, audio, extra):
    """Packed tokens (patch 1: one token per latent position); audio as (B, La, Ca M) tokens."""
    B, _, T, H, W = x.shape
    a = audio.transpose(1, 2).flatten(2) if audio is not None else x.new_zeros(B, 1, cfg.audio_in_channels)
    ts = t * 1000  # fp32, as the pipeline
    v, va = model(hidden_states=x.flatten(2).transpose(1, 2), audio_hidden_states=a, encoder_hidden_states=ctx,
                  audio_encoder_hidden_states=extra["audio_context"].to(ctx), timestep=ts, sigma=ts, num_frames=T,
                  height=H, width=W, fps=cfg.fps, audio_num_frames=a.shape[1], isolate_modalities=audio is None,
                  return_dict=False)
    v = v.transpose(1, 2).reshape(x.shape)
    if audio is None:
        return v
    return v, va.unflatten(2, (audio.shape[1], audio.shape[3])).transpose(1, 2)


def _hunyuan_call(model, cfg, case, x, t, ctx, audio, extra):
    """Text-to-video: the zero condition channels, masked ByT5 and SigLIP tokens."""
    import torch

    B, _, T, H, W = x.shape
    zeros = x.new_zeros
    return model(hidden_states=torch.cat([x, zeros(B, cfg.cond_channels, T, H, W)], 1), timestep=(t * 1000).to(x.dtype),
                 encoder_hidden_states=ctx, encoder_attention_mask=torch.ones(ctx.shape[:2], device=x.device),
                 encoder_hidden_states_2=zeros(B, 256, cfg.glyph_dim),
                 encoder_attention_mask_2=torch.zeros(B, 256, device=x.device),
                 image_embeds=zeros(B, 729, cfg.image_dim), return_dict=False)[0]


@dataclasses.dataclass(frozen=True)
class Family:
    """How the bench runs a family (our config class is its ``FamilySpec``'s): ``transformer`` (diffusers' class) and
    its ``call``; ``tiny`` overrides our tiny network where diffusers fixes a size; ``extra_inputs(cfg, ctx_shape,
    generator)`` draws the inputs its pipeline adds once; ``ours(cfg)`` adds overrides to our command; ``setup()``
    runs before diffusers builds the network."""

    transformer: str
    call: Callable
    tiny: dict = dataclasses.field(default_factory=dict)
    extra_inputs: Callable | None = None
    ours: Callable | None = None
    setup: Callable | None = None


def _nearest_resize_shim() -> None:
    """diffusers' Cosmos transformer resizes its padding mask with torchvision; without torchvision, the same
    nearest-neighbour resize through ``F.interpolate``."""
    import types

    import torch.nn.functional as F
    from diffusers.models.transformers import transformer_cosmos as tc

    if not hasattr(tc, "transforms"):
        resize = lambda x, size, interpolation=None: F.interpolate(x, size=size, mode="nearest")  # noqa: E731
        tc.transforms = types.SimpleNamespace(functional=types.SimpleNamespace(resize=resize),
                                              InterpolationMode=types.SimpleNamespace(NEAREST="nearest"))


def _randn(shape, g):
    import torch

    return torch.randn(shape, generator=g)


FAMILIES = {
    "wan": Family("WanTransformer3DModel", _wan_call),
    "cosmos": Family("CosmosTransformer3DModel", _cosmos_call, setup=_nearest_resize_shim),
    # the CLIP pooled text, as ours' mock data give ours
    "kandinsky6": Family("Kandinsky6Transformer3DModel", _kandinsky6_call,
                         extra_inputs=lambda cfg, ctx_shape, g: {"pooled": _randn((1, cfg.pooled_dim), g)}),
    # the audio connector's output (ours' mock audio_context); the mock data cannot read LTX-2's text width
    # (caption_channels) from the model
    "ltx2": Family("LTX2VideoTransformer3DModel", _ltx2_call,
                   extra_inputs=lambda cfg, ctx_shape, g: {"audio_context": _randn(ctx_shape, g)},
                   ours=lambda cfg: [f"data.context_dim={text_dim(cfg)}"]),
    "hunyuan": Family("HunyuanVideo15Transformer3DModel", _hunyuan_call,
                      tiny={"glyph_hidden": 2048}),  # diffusers fixes HunyuanVideo's ByT5 width at 2048
}


def _module(family: str, name: str):
    import importlib

    return importlib.import_module(f"nemo_vfm.models.{family}.{name}")


def tiny_overrides(case: Case) -> dict:
    """The family's ``tiny`` test architecture, with what diffusers fixes."""
    kw = {**_module(case.family, "flavors").FLAVORS["tiny"], **FAMILIES[case.family].tiny}
    if case.flavor == "ti2v_5b":
        kw.update(in_channels=48, out_channels=48)
    return kw


def model_config(case: Case, tiny: bool):
    cls = _module(case.family, "family").SPEC.config
    flavor = _module(case.family, "flavors").FLAVORS[case.flavor]
    return cls(**{**flavor, **(tiny_overrides(case) if tiny else {})})


def text_dim(cfg) -> int:
    """The width of the text states the network reads (LTX-2 names it ``caption_channels``)."""
    return cfg.caption_channels if hasattr(cfg, "caption_channels") else cfg.context_dim


def audio_shape(case: Case, tiny: bool) -> tuple[int, int, int] | None:
    """The audio latents (channels, frames, mel bins) of ``case``: the tiny network's at ``TINY_AUDIO_FRAMES``."""
    if case.audio is None or not tiny:
        return case.audio
    cfg = model_config(case, tiny=True)
    return cfg.audio_in_channels // cfg.audio_mel_bins, TINY_AUDIO_FRAMES, cfg.audio_mel_bins


def _cli_value(v) -> str:
    return "[" + ",".join(str(x) for x in v) + "]" if isinstance(v, (tuple, list)) else str(v)


def ours_overrides(case: Case, latent, text: int, tiny: bool) -> list[str]:
    t, h, w = latent
    out = ["model.pretrained=None", "data=mock", f"data.num_frames={t}", f"data.height={h}", f"data.width={w}",
           f"data.context_length={text}", *case.overrides]
    family = FAMILIES[case.family]
    if family.ours is not None:
        out += family.ours(model_config(case, tiny))
    if case.audio is not None:
        out.append(f"data.audio_shape={_cli_value(audio_shape(case, tiny))}")
    if tiny:
        out += [f"model.{k}={_cli_value(v)}" for k, v in tiny_overrides(case).items()]
    return out


# -- diffusers ------------------------------------------------------------------------------------------------
def diffusers_net(case: Case, cfg, device, dtype, text: int = TINY_TEXT):
    """diffusers' network of ``cfg`` built in ``dtype`` on ``device`` and ``net(x, t, ctx, audio=None) -> velocity``
    (``(velocity, audio velocity)`` with LTX-2's ``audio (B, Ca, La, M)`` latents) for ``text`` tokens of context."""
    import diffusers
    import torch

    family = FAMILIES[case.family]
    convert = _module(case.family, "convert")
    if family.setup is not None:
        family.setup()
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    torch.manual_seed(0)
    try:
        with torch.device(device):
            model = getattr(diffusers, family.transformer)(**convert.config_to_diffusers(cfg))
    finally:
        torch.set_default_dtype(prev)
    g = torch.Generator().manual_seed(1)
    extra = family.extra_inputs(cfg, (1, text, text_dim(cfg)), g) if family.extra_inputs else {}
    extra = {k: v.to(device, dtype) for k, v in extra.items()}

    def net(x, t, ctx, audio=None):
        return family.call(model, cfg, case, x, t, ctx, audio, extra)

    return model, net


def run_diffusers(case: Case, latent, text: int, tiny: bool, device: str, steps: int, warmup: int) -> dict:
    """diffusers' (+ peft) fine-tuning step of ``case``: ms/step (median), peak GiB, trainable parameters."""
    import torch

    from bench.harness import step_time
    from bench.train_throughput import MasterWeights, time_steps

    dev = torch.device(device)
    dtype = torch.bfloat16  # on the CPU too: the smoke run takes the GPU's path
    cfg = model_config(case, tiny)
    model, net = diffusers_net(case, cfg, dev, dtype, text)
    model.train()
    if case.lora:
        from peft import LoraConfig

        model.requires_grad_(False)
        rank, alpha = case.lora
        model.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights=True,
                                     target_modules=peft_targets(case)))
    model.enable_gradient_checkpointing()
    trainable = [p for p in model.parameters() if p.requires_grad]
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-5, weight_decay=0.0, fused=dev.type == "cuda")  # noqa: E731
    opt = MasterWeights(trainable, adamw)
    g = torch.Generator().manual_seed(0)
    channels = cfg.out_channels
    x0 = torch.randn(1, channels, *latent, generator=g).to(dev, dtype)
    ctx = torch.randn(1, text, text_dim(cfg), generator=g).to(dev, dtype)
    shape = audio_shape(case, tiny)
    a0 = torch.randn(1, *shape, generator=g).to(dev, dtype) if shape else None
    mse = lambda v, n, x: torch.nn.functional.mse_loss(v.float(), (n - x).float())  # noqa: E731

    def step():
        t = torch.rand(1, device=dev)
        noise = torch.randn_like(x0)
        tt = t.view(-1, 1, 1, 1, 1).to(dtype)
        xt = (1 - tt) * x0 + tt * noise
        if a0 is None:
            loss = mse(net(xt, t, ctx), noise, x0)
        else:  # both streams at one time (ours' AudioVideoFlowMatching, weights 1.0)
            an = torch.randn_like(a0)
            at = (1 - tt[..., 0]) * a0 + tt[..., 0] * an
            v, va = net(xt, t, ctx, at)
            loss = mse(v, noise, x0) + mse(va, an, a0)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = time_steps(step, steps, warmup, dev)
    if not all(v == v and abs(v) < 1e6 for v in losses):
        raise RuntimeError(f"diffusers {case.factory}: non-finite loss {losses}")
    return {"path": "diffusers" + (" + peft" if case.lora else ""), "ms": 1e3 * step_time(times),
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else None,
            "trainable_params": sum(p.numel() for p in trainable)}


# -- the bench -----------------------------------------------------------------------------------------------
def run_case(name: str, case: Case, a) -> dict:
    from bench.harness import RecipeCase, run_recipe

    latent, text = (TINY_LATENT, TINY_TEXT) if a.tiny else (case.latent, case.text)
    res = {"case": name, "factory": case.factory, "size": case.size if not a.tiny else "tiny",
           "latent": list(latent), "text_tokens": text, "lora": case.lora}
    if case.audio is not None:
        res["audio"] = list(audio_shape(case, a.tiny))
    rc = RecipeCase(name=name, factory=case.factory, overrides=ours_overrides(case, latent, text, a.tiny) + a.overrides)
    ours = run_recipe(rc, a.steps, a.every, a.skip, a.device)
    if "error" not in ours:
        ours["ms"] = 1e3 * ours["step_s"]
    res["ours"] = ours
    if "diffusers" in a.sides:
        try:
            res["diffusers"] = run_diffusers(case, latent, text, a.tiny, a.device, a.diffusers_steps, a.warmup)
        except Exception as e:  # noqa: BLE001 (an out-of-memory diffusers run is a result, not a crash)
            res["diffusers"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        finally:
            _free(a.device)
    if "ms" in res["ours"] and "ms" in res.get("diffusers", {}):
        res["ratio"] = res["diffusers"]["ms"] / res["ours"]["ms"]
    return res


def _free(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def table(results: list[dict]) -> str:
    lines = ["| case | size | ours ms/step | ours TFLOP/s (MFU) | ours GiB | diffusers ms/step | diffusers GiB | "
             "ours vs diffusers |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        o, d = r["ours"], r.get("diffusers", {})
        om = f"{o['ms']:.0f}" if "ms" in o else f"error: {o.get('error', '')[:60]}"
        tf = f"{o['model_tflops']:.0f} ({100 * o['mfu']:.1f}%)" if o.get("model_tflops") and o.get("mfu") else "-"
        og = f"{o['peak_mem_gib']:.1f}" if o.get("peak_mem_gib") else "-"
        dm = f"{d['ms']:.0f}" if "ms" in d else (f"error: {d['error'][:60]}" if d else "-")
        dg = f"{d['peak_mem_gib']:.1f}" if d.get("peak_mem_gib") else "-"
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
        lines.append(f"| {r['case']} | {r['size']} | {om} | {tf} | {og} | {dm} | {dg} | {ratio} |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help=f"comma list of cases (default: {','.join(DEFAULT)}; all: {','.join(CASES)})")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="the families' tiny test networks (CPU smoke run)")
    p.add_argument("--sides", default="ours,diffusers", help="which to run (comma list)")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="an override for every recipe run")
    p.add_argument("--steps", type=int, default=12, help="our training steps (the launcher's max_steps)")
    p.add_argument("--every", type=int, default=2, help="our log interval (steps)")
    p.add_argument("--skip", type=int, default=2, help="our log intervals dropped as warm-up (compilation)")
    p.add_argument("--diffusers-steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2, help="diffusers' untimed steps")
    p.add_argument("--commit")
    p.add_argument("--out")
    a = p.parse_args(argv)
    a.names = a.only.split(",") if a.only else list(DEFAULT)
    unknown = [n for n in a.names if n not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; choose from {sorted(CASES)}")
    a.sides = a.sides.split(",")
    return a


def main(argv=None) -> int:
    from bench.harness import environment, write_json

    a = parse_args(argv)
    results = []
    for name in a.names:
        results.append(run_case(name, CASES[name], a))
        print(json.dumps({k: v for k, v in results[-1].items() if k != "ours"} | {"ours_ms": results[-1]["ours"].get(
            "ms"), "ours_error": results[-1]["ours"].get("error")}, default=str), flush=True)
        if a.out:  # after every case: a later crash keeps what was measured
            write_json(a.out, environment(a.device, a.commit), results)
    print(table(results))
    if a.out:
        Path(a.out).with_suffix(".md").write_text(table(results) + "\n")
    return 0 if all("ms" in r["ours"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
