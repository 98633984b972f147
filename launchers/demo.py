"""``make demo``: a small text-to-video DiT trained end to end on the CPU, in minutes.

1. makes a synthetic video set (moving coloured shapes with captions that describe them; no downloads)
   and writes a preview of it;
2. trains the ``quickstart`` recipe (the same factory ``launchers/train.py --factory quickstart`` runs);
3. writes a checkpoint, a loss-curve PNG and sample videos (mp4 + gif) for held-in captions,
   and prints where they are, with the samples' score against their captions
   (``nemo_vfm.evaluation.shapes``: flat background, one object of the right colour, moving the stated way).

Run it again and it resumes from its last checkpoint (``--fresh`` starts over).
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="demo_output", help="folder for everything the demo writes")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    p.add_argument("--fresh", action="store_true", help="delete a previous demo run first")
    args = p.parse_args(argv)

    import fiddle as fdl
    import numpy as np

    from nemo_vfm.data.synthetic_video import ShapeClipSpec, make_clip
    from nemo_vfm.io.video import grid, write_gif
    from nemo_vfm_recipes.dit import quickstart

    out = Path(args.out)
    if args.fresh and out.exists():
        shutil.rmtree(out)
    recipe = quickstart()
    recipe.log.root = str(out)
    if args.steps:
        recipe.trainer.max_steps = args.steps

    spec = ShapeClipSpec(num_frames=recipe.data.num_frames, height=recipe.data.height, width=recipe.data.width,
                         position_jitter=recipe.data.position_jitter, size=recipe.data.shape_size)
    clips = [make_clip(spec, recipe.data.seed, i) for i in range(16)]
    up = max(1, 128 // max(spec.height, spec.width))  # cells of ~128 pixels, as the training previews
    preview = grid(np.stack([c.frames.repeat(up, 1).repeat(up, 2) for c in clips]))
    write_gif(out / "dataset_preview.gif", preview, fps=recipe.data.fps)
    (out / "dataset_preview.txt").write_text("\n".join(c.caption for c in clips) + "\n")
    print(f"synthetic dataset: {recipe.data.num_clips} clips of {spec.num_frames}x{spec.height}x{spec.width}, "
          f"preview: {out / 'dataset_preview.gif'}")

    t0 = time.time()
    summary = fdl.build(recipe)()
    exp = Path(summary["exp_dir"])
    mp4 = [s for s in summary["samples"] if s.endswith(".mp4")]
    print(f"\ndemo finished in {time.time() - t0:.0f} s (final loss {summary['loss']:.4f})")
    print(f"  checkpoint : {summary['checkpoint']}")
    print(f"  loss curve : {exp / 'loss_curve.png'}")
    print(f"  samples    : {mp4[-1] if mp4 else '(none)'} (+ .gif, prompts in .txt)")
    print(f"  tensorboard: tensorboard --logdir {exp / 'tb'}")
    print(f"  generate   : .venv/bin/vfm generate --ckpt {summary['checkpoint']} --prompt "
          f"'a red circle moving left on a black background' --out {out / 'generated'}")
    report = Path(mp4[-1]).with_suffix(".json") if mp4 else None
    if report is not None and report.exists():  # the previews scored against their captions (shapes metric)
        from nemo_vfm.evaluation.shapes import format_table

        print(f"\nsample quality of the final preview ({report}):")
        print(format_table(json.loads(report.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
