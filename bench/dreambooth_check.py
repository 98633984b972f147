"""DreamBooth on the quickstart DiT, the way a user runs it, scored with the shapes sample metric.

8 clips of one subject (a red square moving right on a black background, the quickstart's clip size) go to
``launchers/train.py --factory dreambooth`` with the instance prompt "a sks square moving right"; the base
model (``make demo``'s checkpoint) draws the class samples for "a square moving right". ``vfm generate``
then samples the instance prompt with 8 noise seeds from the base model and from the fine-tuned one, and
:mod:`nemo_vfm.evaluation.shapes` scores both grids against "a red square moving right on a black
background" (the subject the prompt never names). CPU, minutes::

    make demo                                 # the base model: demo_output/quickstart
    python bench/dreambooth_check.py          # writes dreambooth_check/dreambooth_check.json
"""

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROMPT, CLASS_PROMPT = "a sks square moving right", "a square moving right"
SUBJECT = "a red square moving right on a black background"


def _instance_clips(folder: Path, n: int, num_frames: int, height: int, width: int, jitter: float) -> None:
    from nemo_vfm.data.synthetic_video import ShapeClipSpec, render_shape_clip
    from nemo_vfm.io.video import write_video

    spec = ShapeClipSpec(num_frames=num_frames, height=height, width=width, position_jitter=jitter)
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):  # paths centred on the frame as in the base model's data: the middle at 0.5 +- jitter
        mid = rng.uniform(0.5 - jitter, 0.5 + jitter, size=2)
        start = (float(mid[0] - spec.speed * (num_frames - 1) / 2), float(mid[1]))
        write_video(folder / f"clip{i}.mp4", render_shape_clip(spec, "square", "red", "black", "right", start))


def _score(ckpt: Path, out: Path, n: int, height: int, width: int) -> dict:
    """``vfm generate`` the instance prompt with n seeds (one grid), scored against the subject."""
    from nemo_vfm.evaluation.shapes import score_videos, split_grid
    from nemo_vfm.io.video import read_video

    up = 8
    cmd = [sys.executable, "-m", "nemo_vfm.cli.main", "generate", "--ckpt", str(ckpt), "--out", str(out),
           "--guidance", "3", "--steps", "24", "--device", "cpu", "--upscale", str(up), "--batch-size", str(n),
           *[a for _ in range(n) for a in ("--prompt", PROMPT)]]
    subprocess.run(cmd, check=True, cwd=ROOT)
    frames, _ = read_video(out / "batch000.mp4")
    return score_videos(split_grid(frames, n, (height * up, width * up)), [SUBJECT] * n)


def _commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return r.stdout.strip() or "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="demo_output/quickstart", help="the base model (make demo's experiment)")
    p.add_argument("--out", default="dreambooth_check", help="output folder")
    p.add_argument("--clips", type=int, default=8, help="instance clips")
    p.add_argument("--num", type=int, default=8, help="samples to score before and after")
    p.add_argument("overrides", nargs="*", help="more launchers/train.py overrides (e.g. trainer.max_steps=100)")
    args = p.parse_args(argv)

    from nemo_vfm.evaluation.shapes import format_table
    from nemo_vfm_recipes.finetune import dreambooth

    base, out = Path(args.base), Path(args.out)
    if not base.exists():
        raise SystemExit(f"dreambooth_check: no base model at {base}; run `make demo` first or pass --base")
    d = dreambooth().data
    _instance_clips(out / "instance", args.clips, d.num_frames, d.height, d.width, jitter=0.1)
    before = _score(base, out / "before", args.num, d.height, d.width)
    t0 = time.time()
    train = [sys.executable, "launchers/train.py", "--factory", "dreambooth", "--yes", f"init_from={base}",
             f"data.instance_data={out / 'instance'}", f"data.instance_prompt={PROMPT}",
             f"data.class_data={out / 'class'}", f"data.class_prompt={CLASS_PROMPT}", f"log.root={out}",
             "log.resume=False", *args.overrides]
    subprocess.run(train, check=True, cwd=ROOT)
    train_s = time.time() - t0
    after = _score(out / "dreambooth", out / "after", args.num, d.height, d.width)
    for name, report in (("base model", before), ("after DreamBooth", after)):
        print(f"\n{name}, '{PROMPT}' scored as '{SUBJECT}':\n{format_table(report)}")
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": _commit(), "command": " ".join(["python", *sys.argv]), "base": str(base),
              "prompt": PROMPT, "subject": SUBJECT, "train_s": round(train_s, 1),
              "before": {k: before[k] for k in ("pass_rate", "rates")},
              "after": {k: after[k] for k in ("pass_rate", "rates")}}
    (out / "dreambooth_check.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"\npass rate {before['pass_rate']:.0%} -> {after['pass_rate']:.0%}; training {train_s:.0f} s; "
          f"wrote {out / 'dreambooth_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
