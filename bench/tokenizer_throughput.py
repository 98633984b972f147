"""Video tokenizer encode/decode throughput (frames/s) and peak memory, 720p clips by default.

    python bench/tokenizer_throughput.py                           # our 4x8x8, 8x8x8, 8x16x16 on CUDA, bf16
    python bench/tokenizer_throughput.py --tiled                   # also tiled (256px tiles) + chunked (2 latents)
    python bench/tokenizer_throughput.py --spec "wan:path=/models/Wan2.1-T2V-1.3B-Diffusers"
    python bench/tokenizer_throughput.py --device cpu --tiny       # seconds on a CPU (tests use this)

Throughput does not depend on the weights, so our tokenizers run with random weights at their recipe
width (32); add e.g. ``--spec causal:width=64,...`` for wider ones. Writes JSON to
``bench/results/tokenizer_throughput_<device>.json`` (``--out`` to change).
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import environment  # noqa: E402
from nemo_vfm.tokenizers.registry import tokenizer_from_spec  # noqa: E402
from nemo_vfm.tokenizers.tiling import TiledTokenizer  # noqa: E402

OURS = {  # the recipe architectures (recipes/tokenizer.py), random weights
    "causal_4x8x8": "causal:temporal_compression=4,spatial_compression=8,width=32,latent_channels=16",
    "causal_8x8x8": "causal:temporal_compression=8,spatial_compression=8,width=32,latent_channels=16",
    "causal_8x16x16": "causal:temporal_compression=8,spatial_compression=16,patch_size=2,width=32,latent_channels=16",
}
TINY = {k: v.replace("width=32", "width=8") for k, v in OURS.items()}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device, warmup: int, iters: int) -> tuple[float, float | None, object]:
    """Mean seconds per call, peak memory in GiB (CUDA only) and the last output."""
    out = None
    for _ in range(warmup):
        out = fn()
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        out = fn()
    _sync(device)
    seconds = (time.perf_counter() - t0) / iters
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return seconds, peak, out


def bench_one(name: str, tokenizer, video: torch.Tensor, device: torch.device, warmup: int, iters: int) -> dict:
    frames = video.shape[0] * video.shape[2]
    row = {"name": name, "input": list(video.shape), "latent_channels": tokenizer.latent_channels,
           "compression": f"{tokenizer.temporal_compression}x{tokenizer.spatial_compression}x{tokenizer.spatial_compression}"}
    try:
        with torch.inference_mode():
            enc_s, enc_mem, z = _timed(lambda: tokenizer.encode(video), device, warmup, iters)
            dec_s, dec_mem, _ = _timed(lambda: tokenizer.decode(z), device, warmup, iters)
        row.update(latent_shape=list(z.shape), encode_s=enc_s, decode_s=dec_s, encode_fps=frames / enc_s,
                   decode_fps=frames / dec_s, encode_peak_gib=enc_mem, decode_peak_gib=dec_mem)
    except torch.OutOfMemoryError as e:
        row["error"] = f"out of memory: {str(e).splitlines()[0]}"
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--frames", type=int, default=33, help="1 + 8k works for every compression here")
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--spec", action="append", default=[], help="extra tokenizer spec(s) (registry syntax)")
    p.add_argument("--only-specs", action="store_true", help="skip our built-in tokenizers")
    p.add_argument("--tiled", action="store_true", help="also run each tokenizer tiled and chunked")
    p.add_argument("--tile-size", type=int, default=256)
    p.add_argument("--chunk-latents", type=int, default=2)
    p.add_argument("--tiny", action="store_true", help="9 frames of 64x96, width-8 models, 1 iteration")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.tiny:
        args.frames, args.height, args.width, args.warmup, args.iters = 9, 64, 96, 0, 1
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but CUDA is not available; pass --device cpu (with --tiny)", file=sys.stderr)
        return 2
    dtype = DTYPES[args.dtype] if device.type == "cuda" else torch.float32
    specs = {} if args.only_specs else dict(TINY if args.tiny else OURS)
    specs.update({s.split(":")[0] + (f"_{i}" if s.split(":")[0] in specs else ""): s for i, s in enumerate(args.spec)})
    torch.manual_seed(0)
    video = torch.rand(args.batch, 3, args.frames, args.height, args.width, device=device, dtype=dtype) * 2 - 1
    rows = []
    for name, spec in specs.items():
        tokenizer = tokenizer_from_spec(spec).to(device=device, dtype=dtype).eval()
        variants = [(name, tokenizer)]
        if args.tiled:
            variants.append((f"{name}_tiled", TiledTokenizer(tokenizer, tile_size=args.tile_size,
                                                             chunk_latents=args.chunk_latents)))
        for vname, tok in variants:
            row = bench_one(vname, tok, video, device, args.warmup, args.iters)
            rows.append(row)
            if "error" in row:
                print(f"{vname:24s} {row['error']}", flush=True)
            else:
                mem = lambda g: "-" if g is None else f"{g:.1f} GiB"
                print(f"{vname:24s} encode {row['encode_fps']:8.1f} frames/s ({mem(row['encode_peak_gib'])})   "
                      f"decode {row['decode_fps']:8.1f} frames/s ({mem(row['decode_peak_gib'])})", flush=True)
        del tokenizer, variants
    result = {
        **environment(device), "benchmark": "tokenizer_throughput", "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""),
        "input": {"batch": args.batch, "frames": args.frames, "height": args.height, "width": args.width},
        "iters": args.iters, "tiny": args.tiny, "results": rows,
    }
    out = Path(args.out) if args.out else Path(__file__).parent / "results" / f"tokenizer_throughput_{device.type}{'_tiny' if args.tiny else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
