"""Context-parallel inference benchmark: DiT-7B text-to-video generation on 1, 2 and 4 GPUs (bf16).

    # one process per GPU count, then the table (speedup and efficiency against the 1-GPU run)
    for n in 1 2 4; do torchrun --nproc-per-node $n bench/cp_inference.py || exit 1; done
    torchrun --nproc-per-node 4 bench/cp_inference.py --cfg-parallel      # 2 CFG groups x CP2
    python bench/cp_inference.py --summarize [DIR ...]                    # table + summary JSON
    # CPU smoke test (gloo, tiny model): --device cpu --flavor tiny --text-encoder hash --latent 2 8 8

Each run builds DiT-7B (flavor ``7b``: 28 blocks, hidden 4096, 32 heads, cross-attention to 4096-dim text,
AdaLN-LoRA rank 256; 16 latent channels, patch 1x2x2) with random weights on the meta device, materialises
it in bf16 on every GPU (the same seed everywhere, so all GPU counts run the same network), and
generates one video through :class:`nemo_vfm.inference.cp_engine.InferenceEngine`, the engine behind
``vfm generate``:

- **text encode** (rank 0, broadcast): a T5-XXL-sized encoder with random weights (24 layers, d=4096,
  64 heads, FFN 15360 = the weights and FLOPs of T5's gated 10240 FFN, 4.6B parameters, 512 tokens;
  ``torch.nn.TransformerEncoder``), or ``--text-encoder hash``;
- **denoise**: ``--steps`` (50) steps of the ``--sampler`` (``res``: one network call per step) with
  classifier-free guidance batched (or ``--cfg-parallel``); the latent ``--latent T H W`` (default 8x64x64
  = 8,192 video tokens) split over CP ranks (``--cp-kind``, auto = all-to-all);
- **decode**: our causal 4x8x8 tokenizer (random weights, 16 channels) tiled (256 px tiles, exact halo),
  tiles dealt to all ranks: 29 frames at 512x512 for the default latent.

A short warm-up generation (``--warmup-steps``) runs first. Reported (JSON under ``$OUT`` or
bench/results, and one markdown row): seconds per stage, ms per network call, model TFLOP/s per GPU;
the final latents (``.latents.pt``) are saved so that ``--summarize`` can check that every GPU count made the same video
(max difference relative to the 1-GPU latents) next to speedup and efficiency.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import device_peak  # noqa: E402


def out_dir() -> Path:
    d = Path(os.environ.get("OUT", Path(__file__).resolve().parent / "results"))
    d.mkdir(parents=True, exist_ok=True)
    return d


# -- model FLOPs -------------------------------------------------------------------------------------------
def forward_flops(cfg, tokens: int, text_len: int, batch: int) -> float:
    """Matmul FLOPs of one DiT forward over ``batch`` samples of ``tokens`` video tokens (text k/v cached)."""
    d, L = cfg.hidden_size, cfg.num_layers
    weights = L * (4 * d * d + (2 * d * d if cfg.context_dim else 0) + (3 if cfg.mlp == "swiglu" else 2) * d * cfg.ffn_size)
    pt, ph, pw = cfg.patch_size
    weights += pt * ph * pw * (cfg.in_channels + cfg.out_channels) * d
    attn = 4 * tokens * d * L + (4 * text_len * d * L if cfg.context_dim else 0)
    return batch * tokens * (2 * weights + attn)


# -- a T5-XXL-shaped text encoder with random weights (torch only) --------------------------------------------
class RandomTransformerTextEncoder:
    """Hash-token embeddings through a random ``nn.TransformerEncoder`` of T5-XXL's encoder size: the
    compute of a real T5-XXL forward (24 x [self-attention + gated 10240-wide FFN] at d=4096), not its quality."""

    def __init__(self, dim=4096, layers=24, heads=64, ffn=15360, max_length=512, device="cuda",
                 dtype=torch.bfloat16):
        from torch import nn

        from nemo_vfm.tokenizers.hash_text import HashTextEncoder

        self.dim, self.max_length, self.device, self.dtype = dim, max_length, device, dtype
        self.tokens = HashTextEncoder(dim=dim, max_length=max_length)
        with torch.device(device):  # built on the GPU: initialising 4.6B parameters on the CPU takes minutes
            layer = nn.TransformerEncoderLayer(dim, heads, ffn, dropout=0.0, activation="gelu", batch_first=True,
                                               norm_first=True, dtype=dtype)
            self.net = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()

    @torch.no_grad()
    def encode(self, captions):
        emb, mask = self.tokens.encode(captions)
        x = self.net(emb.to(self.device, self.dtype))  # padded to max_length, as T5 pipelines do
        return x.float(), mask


def build_model(args, device, dtype):
    from nemo_vfm.models.dit.flavors import dit_config

    overrides = dict(in_channels=16, context_dim=args.text_dim)
    cfg = dit_config(args.flavor, **overrides)
    model = cfg.build("meta").to(dtype)
    model.to_empty(device=device)
    torch.manual_seed(0)  # same weights on every rank and for every GPU count
    model.init_weights()
    with torch.no_grad():  # move the adaLN-Zero / zero final layer off zero, so the output is not trivial
        for p in model.parameters():
            if p.dim() >= 2 and not bool(p.any()):
                p.normal_(0.0, 0.02)
    return model.eval()


def run(args) -> int:
    import torch.distributed as dist

    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.distributed import InferenceLayout, check_model_layout, init_distributed
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.sizes import check_latent_size
    from nemo_vfm.models.dit.flavors import dit_config
    from nemo_vfm.tokenizers.causal import CausalVideoTokenizer
    from nemo_vfm.tokenizers.tiling import TiledTokenizer

    rank, world, device = init_distributed(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda and args.dtype == "bf16" else torch.float32
    layout = InferenceLayout.for_world(world, tp=args.tp, cfg_parallel=args.cfg_parallel, cp_kind=args.cp_kind,
                                       attention_backend=args.attention_backend)
    cfg = dit_config(args.flavor, in_channels=16, context_dim=args.text_dim)
    latent = tuple(args.latent)
    check_latent_size(latent, cfg.patch_size, layout.token_split)
    check_model_layout(cfg, layout, latent)  # before anything is built
    t0 = time.perf_counter()
    model = build_model(args, device, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    if args.text_encoder == "t5xxl":
        text = RandomTransformerTextEncoder(dim=args.text_dim, layers=args.text_layers, heads=args.text_dim // 64,
                                            ffn=args.text_dim * 15 // 4, max_length=args.text_len, device=device,
                                            dtype=dtype) if rank == 0 else None
    else:
        from nemo_vfm.tokenizers.hash_text import HashTextEncoder

        text = HashTextEncoder(dim=args.text_dim, max_length=args.text_len) if rank == 0 else None
    torch.manual_seed(1)
    tok = CausalVideoTokenizer(temporal_compression=4, spatial_compression=8, latent_channels=16,
                               width=args.tokenizer_width)
    tok = TiledTokenizer(tok.to(device, dtype).eval(), tile_size=args.decode_tile, tile_overlap=args.decode_tile // 4)
    engine = InferenceEngine.from_model(model, EDM(), layout, device=device, dtype=dtype, tokenizer=tok,
                                        text_encoder=text)
    build_s = time.perf_counter() - t0
    prompts = [f"a video of a red fox running through deep snow, shot {i}" for i in range(args.batch)]
    shape = (16, *latent)
    pt, ph, pw = cfg.patch_size
    tokens = (latent[0] // pt) * (latent[1] // ph) * (latent[2] // pw)
    if args.warmup_steps:
        engine.generate(prompts, shape, SamplingConfig(num_steps=args.warmup_steps, sampler=args.sampler,
                                                       guidance=args.guidance, seed=args.seed))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    if dist.is_initialized():
        dist.barrier()
    sampling = SamplingConfig(num_steps=args.steps, sampler=args.sampler, guidance=args.guidance, seed=args.seed)
    videos, times = engine.generate(prompts, shape, sampling, progress=True, decode=True)
    latents = engine.last_latents
    nfe = {"heun": 2 * args.steps - 1}.get(args.sampler, args.steps)
    calls_batch = args.batch * (1 if args.cfg_parallel or args.guidance == 1.0 else 2)
    flops = forward_flops(cfg, tokens, args.text_len, calls_batch) * nfe * (2 if args.cfg_parallel else 1)
    tflops_gpu = flops / times["denoise_s"] / world / 1e12
    if rank != 0:
        if dist.is_initialized():
            dist.destroy_process_group()
        return 0
    kind = layout.resolved_cp_kind(cfg.num_heads) if layout.cp > 1 else ""
    layout_name = f"cp{layout.cp}{kind}" + (f"_tp{layout.tp}" if layout.tp > 1 else "") + ("_cfgp" if layout.cfg_parallel else "")
    name = f"cp_inference_{args.flavor}_{tokens}tok_{world}gpu_{layout_name}{args.tag}"
    result = {
        "benchmark": "cp_inference", "flavor": args.flavor, "params": n_params, "world_size": world,
        "layout": {"cp": layout.cp, "tp": layout.tp, "cfg_parallel": layout.cfg_parallel,
                   "cp_kind": layout.resolved_cp_kind(cfg.num_heads) if layout.cp > 1 else None,
                   "attention_backend": layout.attention_backend},
        "latent": list(latent), "tokens_per_sample": tokens, "batch": args.batch, "text_len": args.text_len,
        "text_encoder": args.text_encoder, "steps": args.steps, "sampler": args.sampler, "nfe": nfe,
        "guidance": args.guidance, "dtype": str(dtype).replace("torch.", ""),
        "video_shape": list(videos.shape), "times": times, "ms_per_nfe": 1e3 * times["denoise_s"] / nfe,
        "model_tflops_per_gpu": tflops_gpu, "mfu": tflops_gpu / peak if (peak := args.peak_tflops or device_peak(device)) else None, "build_s": build_s,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
    }
    out = out_dir()
    torch.save(latents.float().cpu(), out / f"{name}.latents.pt")
    result["latents_file"] = f"{name}.latents.pt"
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    t = times
    print(json.dumps(result, indent=1))
    print(f"| {world} | {layout_name} | {t['text_encode_s']:.2f} | {t['denoise_s']:.2f} | {t['decode_s']:.2f} | "
          f"{result['ms_per_nfe']:.0f} | {tflops_gpu:.0f} |")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


# -- summary ------------------------------------------------------------------------------------------------
def summarize(folders: list[Path], out: Path) -> int:
    """Table of every run found in ``folders`` (speedup against the 1-GPU run of the same setting) -> ``out``."""
    runs = []
    for folder in folders:
        for p in sorted(Path(folder).glob("cp_inference_*gpu_*.json")):
            r = json.loads(p.read_text())
            r["_dir"] = Path(folder)
            runs.append(r)
    if not runs:
        print(f"no cp_inference_*gpu_*.json results in {', '.join(map(str, folders))}", file=sys.stderr)
        return 1
    groups: dict = {}
    for r in runs:
        key = (r["flavor"], r["tokens_per_sample"], r["steps"], r["sampler"], r["batch"], r["device"],
               r["text_encoder"], r["text_len"], r["guidance"], r["dtype"])
        groups.setdefault(key, []).append(r)
    lines, summary = [], []
    for (flavor, tokens, steps, sampler, batch, device, *_), rs in groups.items():
        rs.sort(key=lambda r: (r["world_size"], r["layout"]["cfg_parallel"]))
        base = next((r for r in rs if r["world_size"] == 1), None)
        ref = None
        if base is not None and base.get("latents_file") and (base["_dir"] / base["latents_file"]).exists():
            ref = torch.load(base["_dir"] / base["latents_file"], weights_only=True)
        lines += [f"DiT-{flavor}, {tokens} video tokens, {steps} {sampler} steps ({rs[0]['nfe']} network calls), "
                  f"batch {batch}, {rs[0]['dtype']}, {device}:", "",
                  "| GPUs | layout | denoise (s) | speedup | efficiency | text encode / denoise / decode (s) | "
                  "ms per call | TFLOP/s/GPU | max latent diff vs 1 GPU |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            t, lay = r["times"], r["layout"]
            speedup = base["times"]["denoise_s"] / t["denoise_s"] if base else float("nan")
            eff = speedup / r["world_size"]
            diff = None
            if ref is not None and r.get("latents_file") and (r["_dir"] / r["latents_file"]).exists():
                x = torch.load(r["_dir"] / r["latents_file"], weights_only=True)
                diff = ((x - ref).abs().max() / ref.abs().max()).item()
            name = f"CP{lay['cp']}" + (f" ({lay['cp_kind']})" if lay["cp_kind"] else "") + \
                (f" x TP{lay['tp']}" if lay["tp"] > 1 else "") + (" x CFG2" if lay["cfg_parallel"] else "")
            lines.append(f"| {r['world_size']} | {name} | {t['denoise_s']:.2f} | {speedup:.2f}x | {100 * eff:.0f}% | "
                         f"{t['text_encode_s']:.2f} / {t['denoise_s']:.2f} / {t['decode_s']:.2f} | "
                         f"{r['ms_per_nfe']:.0f} | {r['model_tflops_per_gpu']:.0f} | "
                         f"{'-' if diff is None else f'{diff:.1e}'} |")
            summary.append({"flavor": flavor, "tokens": tokens, "gpus": r["world_size"], "layout": lay,
                            "denoise_s": t["denoise_s"], "speedup": speedup, "efficiency": eff, "times": t,
                            "ms_per_nfe": r["ms_per_nfe"], "tflops_per_gpu": r["model_tflops_per_gpu"],
                            "max_latent_rel_diff_vs_1gpu": diff, "device": device})
        lines.append("")
    table = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cp_inference.md").write_text(table + "\n")
    (out / "cp_inference_summary.json").write_text(json.dumps(summary, indent=1))
    print(table)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summarize", nargs="*", metavar="DIR", default=None,
                    help="read the JSON results in DIRs (default: $OUT or bench/results) and write the table there")
    ap.add_argument("--flavor", default="7b")
    ap.add_argument("--latent", type=int, nargs=3, default=(8, 64, 64), metavar=("T", "H", "W"),
                    help="latent frames/height/width (default 8x64x64: 8,192 tokens with patch 1x2x2)")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--sampler", default="res", choices=("heun", "euler", "res"))
    ap.add_argument("--guidance", type=float, default=7.0)
    ap.add_argument("--batch", type=int, default=1, help="prompts (videos) per generation")
    ap.add_argument("--cfg-parallel", action="store_true")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--cp-kind", default="auto", choices=("auto", "ring", "a2a"))
    ap.add_argument("--attention-backend", default="auto", choices=("auto", "flash", "cudnn", "math"),
                    help="ring attention's block kernel")
    ap.add_argument("--text-encoder", default="t5xxl", choices=("t5xxl", "hash"))
    ap.add_argument("--text-dim", type=int, default=4096)
    ap.add_argument("--text-len", type=int, default=512)
    ap.add_argument("--text-layers", type=int, default=24, help="layers of the T5-XXL-shaped text encoder")
    ap.add_argument("--tokenizer-width", type=int, default=64)
    ap.add_argument("--decode-tile", type=int, default=256, help="decode tile size in pixels")
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--peak-tflops", type=float, help="dense bf16 peak per GPU (default: the device's, from "
                    "nemo_vfm.models.flops)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu (gloo smoke test)")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if args.summarize is not None:
        return summarize([Path(d) for d in args.summarize] or [out_dir()], out_dir())
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
