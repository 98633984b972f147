"""At which noise levels does a sampler decide *where* the shape is? And does training visit them?

    python bench/layout_noise_levels.py --frames 8 --size 32          # the CPU demo's clips
    python bench/layout_noise_levels.py --frames 16 --size 64         # the GPU learning check's clips
    python bench/layout_noise_levels.py --size 32 --position-jitter 0.1  # paths near the centre

For a few captions it renders ``--candidates`` clips that differ only in where the shape is (the
generator's ``ShapeClipSpec.position_jitter``), adds noise ``sigma`` to one of them and computes the exact
posterior over the candidates, ``softmax(-|x - x_i|^2 / (2 sigma^2))``. Its perplexity is the number of
positions still in play: 1 means the layout is decided, ``--candidates`` means the noise hides it.
The last column is the share of training samples that EDM's log-normal noise distribution
(``--p-mean``, ``--p-std``) puts above ``sigma``.
"""

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from nemo_vfm.data.synthetic_video import ShapeClipSpec, render_shape_clip  # noqa: E402
from nemo_vfm.io.video import frames_to_tensor  # noqa: E402

CAPTIONS = (("circle", "red", "black", "left"), ("square", "yellow", "gray", "up"),
            ("triangle", "purple", "navy", "right"))
SIGMAS = (0.5, 1, 2, 3, 5, 8, 12, 20, 40, 80)


def perplexities(spec: ShapeClipSpec, candidates: int, trials: int, seed: int = 0) -> dict[float, float]:
    """Mean perplexity of the posterior over the shape's positions at each of ``SIGMAS`` (pixels in [-1, 1])."""
    rng, g = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    j = spec.position_jitter
    out = {s: [] for s in SIGMAS}
    for shape, color, background, motion in CAPTIONS:
        starts = rng.uniform(0.5 - j, 0.5 + j, size=(candidates, 2))
        x = torch.stack([frames_to_tensor(render_shape_clip(spec, shape, color, background, motion, tuple(st)))
                         for st in starts]).flatten(1).double()
        for s in SIGMAS:
            for i in range(trials):
                noisy = x[i] + s * torch.randn(x.shape[1], generator=g, dtype=torch.float64)
                w = torch.softmax(-((x - noisy) ** 2).sum(1) / (2 * s * s), 0)
                out[s].append(math.exp(-float((w * w.clamp_min(1e-300).log()).sum())))
    return {s: float(np.mean(v)) for s, v in out.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", type=int, default=32, help="frame height and width in pixels")
    p.add_argument("--position-jitter", type=float, default=0.3)
    p.add_argument("--candidates", type=int, default=256)
    p.add_argument("--trials", type=int, default=16, help="noisy draws per caption and sigma")
    p.add_argument("--p-mean", type=float, default=-1.2)
    p.add_argument("--p-std", type=float, default=1.2)
    args = p.parse_args(argv)

    spec = ShapeClipSpec(num_frames=args.frames, height=args.size, width=args.size,
                         position_jitter=args.position_jitter)
    ppl = perplexities(spec, args.candidates, args.trials)
    print(f"{args.frames}x{args.size}x{args.size}, position 0.5 +- {args.position_jitter}, {args.candidates} candidates; "
          f"training noise ln(sigma) ~ N({args.p_mean}, {args.p_std})")
    print("sigma   positions in play   P(train sigma > sigma)")
    for s, v in ppl.items():
        above = 0.5 * math.erfc((math.log(s) - args.p_mean) / (args.p_std * math.sqrt(2)))
        print(f"{s:5g}   {v:17.1f}   {above:22.2%}")


if __name__ == "__main__":
    main()
