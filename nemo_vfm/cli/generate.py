"""``vfm generate``: sample videos from a checkpoint with classifier-free guidance; writes mp4 and gif.

    vfm generate --ckpt experiments/quickstart --prompt "a red circle moving left on a black background"
    vfm generate --ckpt run/checkpoints/step=00001000.ckpt --prompts prompts.txt --guidance 5 --steps 50
"""

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="a step=N.ckpt file, or an experiment folder (newest checkpoint)")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts", help="a text file with one prompt per line")
    p.add_argument("--out", default="generated", help="output folder")
    p.add_argument("--steps", type=int, default=35, help="sampler steps")
    p.add_argument("--guidance", type=float, default=5.0, help="classifier-free guidance scale (1 = off)")
    p.add_argument("--sampler", default=None, help="heun | euler (default: heun for EDM, euler for flow matching)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8, help="prompts per batch")
    p.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA weights")
    p.add_argument("--device", default="cuda" if _cuda() else "cpu")
    p.add_argument("--upscale", type=int, default=0, help="nearest-neighbour upscaling of the output (0: auto)")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def run(args) -> int:
    from tqdm.auto import tqdm

    from nemo_vfm.data.encoders import build_text_encoder, build_tokenizer
    from nemo_vfm.diffusion.flow_matching import FlowMatching
    from nemo_vfm.inference.checkpoint import load_checkpoint
    from nemo_vfm.inference.generate import SamplingConfig, generate_videos, write_videos

    prompts = list(args.prompt)
    if args.prompts:
        prompts += [line.strip() for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    if not prompts:
        raise SystemExit("vfm generate: give at least one --prompt or a --prompts file")
    loaded = load_checkpoint(args.ckpt, args.device, use_ema=not args.no_ema)
    gen = loaded.generation
    if not gen:
        raise SystemExit(f"vfm generate: {args.ckpt} does not record its tokenizer and text encoder "
                         "(trained on mock latents?); nothing to decode with")
    tokenizer = build_tokenizer(gen["tokenizer"]["name"], **gen["tokenizer"]["kwargs"]).to(args.device).eval()
    text_encoder = build_text_encoder(gen["text_encoder"]["name"], **gen["text_encoder"]["kwargs"])
    sampler = args.sampler or ("euler" if isinstance(loaded.objective, FlowMatching) else "heun")
    cfg = SamplingConfig(num_steps=args.steps, guidance=args.guidance, sampler=sampler, seed=args.seed)
    out = Path(args.out)
    fps = gen.get("fps") or 8.0
    written = []
    for i in tqdm(range(0, len(prompts), args.batch_size), desc="generating", unit="batch"):
        batch = prompts[i: i + args.batch_size]
        videos, times = generate_videos(loaded.net, loaded.objective, tokenizer, text_encoder, batch,
                                        gen["latent_shape"], cfg, device=args.device, fps=gen.get("fps"))
        upscale = args.upscale or max(1, 256 // max(videos.shape[-2:]))
        written += write_videos(videos, out / f"batch{i // args.batch_size:03d}", fps=fps, upscale=upscale,
                                captions=batch)
        print("  " + ", ".join(f"{k} {v:.2f}s" for k, v in times.items()))
    print(f"wrote {len([w for w in written if w.suffix == '.mp4'])} video grid(s) to {out} "
          f"(checkpoint step {loaded.step})")
    return 0
