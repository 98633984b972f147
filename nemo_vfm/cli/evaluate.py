"""``vfm evaluate``: sample a checkpoint trained on the synthetic shapes data and score the videos against
their captions (:mod:`nemo_vfm.evaluation.shapes`: background, object colour, object count, motion).

    vfm evaluate --ckpt demo_output/quickstart --num 32
    vfm evaluate --ckpt run/checkpoints/step=00002000.ckpt --steps 24 --guidance 3 --out eval/ --device cuda

Captions are drawn (seeded) from the generator's vocabulary (colour x shape x direction x background), so
some are combinations the training set may not hold. Prints a table (one row per video) and writes ``OUT/evaluation.json`` and the
sample grid (``OUT/samples.gif``/``.mp4``).
"""

import argparse
import json
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="a step=N.ckpt file, a sharded folder, a .safetensors export or an "
                                                 "experiment folder (its newest checkpoint)")
    p.add_argument("--num", type=int, default=16, help="videos to sample and score")
    p.add_argument("--steps", type=int, default=None, help="sampler steps (default 24; a distilled student: its own)")
    p.add_argument("--guidance", type=float, default=None, help="classifier-free guidance scale (1 = off; default 3; "
                                                                "a distilled student: 1)")
    p.add_argument("--sampler", default=None, choices=("heun", "euler", "res", "flow-euler"),
                   help="default: heun for EDM, flow-euler for flow matching")
    p.add_argument("--seed", type=int, default=0, help="seed of the captions and of the noise")
    p.add_argument("--batch-size", type=int, default=16, help="videos per batch")
    p.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA weights")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--out", default="evaluation", help="output folder")


def vocabulary_captions(num: int, seed: int) -> list[str]:
    """``num`` captions drawn with replacement from the generator's vocabulary (same words as its captions)."""
    import numpy as np

    from nemo_vfm.data.synthetic_video import BACKGROUNDS, COLORS, MOTIONS, SHAPES

    rng = np.random.default_rng(seed)
    pick = [list(COLORS), list(SHAPES), list(MOTIONS), list(BACKGROUNDS)]
    return [f"a {c} {s} moving {m} on a {b} background" for c, s, m, b in
            ([words[rng.integers(len(words))] for words in pick] for _ in range(num))]


def run(args) -> int:
    try:
        return _run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"vfm evaluate: error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    import torch

    from nemo_vfm.cli.generate import sampling_config
    from nemo_vfm.data.encoders import build_text_encoder, build_tokenizer
    from nemo_vfm.evaluation.shapes import format_table, score_videos
    from nemo_vfm.inference.checkpoint import load_checkpoint
    from nemo_vfm.inference.generate import generate_videos, write_videos

    if args.num < 1:
        raise ValueError(f"--num must be >= 1, got {args.num}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    loaded = load_checkpoint(args.ckpt, device=device, use_ema=not args.no_ema)
    gen = loaded.generation
    if not gen:
        raise ValueError(f"{args.ckpt} does not record its tokenizer and text encoder (trained on mock latents?); "
                         "evaluate a checkpoint trained on the shapes data")
    cfg = sampling_config(args, gen, loaded.objective, args.ckpt, default_steps=24, default_guidance=3.0)
    sampler = cfg.sampler
    captions = vocabulary_captions(args.num, args.seed)
    tokenizer = build_tokenizer(gen["tokenizer"]["name"], **gen["tokenizer"]["kwargs"]).to(device).eval()
    text_encoder = build_text_encoder(gen["text_encoder"]["name"], **gen["text_encoder"]["kwargs"])
    print(f"evaluating {args.ckpt} (step {loaded.step}) on {args.num} captions: {sampler} x {args.steps} steps, "
          f"guidance {args.guidance}, {device}")
    videos = []
    for i in range(0, len(captions), args.batch_size):
        batch = captions[i: i + args.batch_size]
        v, _ = generate_videos(loaded.net, loaded.objective, tokenizer, text_encoder, batch, gen["latent_shape"], cfg,
                               device=device, fps=gen.get("fps"))
        videos.append(v)
    videos = torch.cat(videos)
    report = score_videos(videos, captions)
    print(format_table(report))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report.update({"checkpoint": str(args.ckpt), "step": loaded.step, "sampler": sampler, "steps": args.steps,
                   "guidance": args.guidance, "seed": args.seed, "ema": not args.no_ema})
    (out / "evaluation.json").write_text(json.dumps(report, indent=1) + "\n")
    upscale = max(1, 128 // max(videos.shape[-2:]))
    write_videos(videos, out / "samples", fps=gen.get("fps") or 8.0, upscale=upscale, captions=captions)
    print(f"wrote {out / 'evaluation.json'} and {out / 'samples.gif'}")
    return 0
