"""Scaling of the user's inference command: ``vfm generate`` (``torchrun -m nemo_vfm.cli.main generate``) at several
parallel layouts on one host, against one GPU.

    python bench/wan_pipeline_folder.py --flavor t2v_14b --out /tmp/wan14b            # random weights, real sizes
    python bench/generate_scaling.py --ckpt /tmp/wan14b --layout 1 --layout "4:--cp 4" \\
        --layout "4:--cfg-parallel" --steps 4 --out bench/results/generate_wan14b_4gpu.json
    # CPU smoke run (gloo)
    python bench/generate_scaling.py --ckpt /tmp/wan_tiny --device cpu --layout 1 --layout "2:--cp 2" \\
        --steps 2 --gen-args "--frames 5 --height 32 --width 32" --out /tmp/g.json

Each layout ``N[:extra vfm generate arguments]`` runs the command a user types (N=1: ``python -m nemo_vfm.cli.main
generate``; N>1: under ``torchrun --standalone --nproc-per-node N``) on ``--prompts`` prompts, one per batch, at the
checkpoint's default size unless ``--gen-args`` says otherwise. The first batch pays for compilation and warm-up, so
the figures are the **last** batch's stage times as ``vfm generate`` prints them (text encode, denoise, decode).
Per layout: seconds per stage, seconds per sampler step, model TFLOP/s per GPU of the denoising (the family's FLOP
counter, one network call per step over the conditional and unconditional batch), speed-up and parallel efficiency
(speed-up / N) of the denoising and of the whole batch against the first layout with N=1, and how far its last video
is from that layout's (mean absolute difference of the decoded frames, 0-255; bf16 reductions in another order
differ a little). NVLink multicast is off in the child environment, and exactly N GPUs are visible.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import child_env, comm_env, rank_tail, run_logged, write_json  # noqa: E402

STAGES = re.compile(r"text encode ([\d.]+)s, denoise ([\d.]+)s, decode ([\d.]+)s")
HEADER = re.compile(r"\((\d+)x(\d+)x(\d+)x(\d+) latents\) on (\d+) process\(es\): (.*?), (\S+) x (\d+) steps")


def parse_layout(text: str) -> tuple[int, list[str]]:
    """``"4:--cp 4"`` -> ``(4, ["--cp", "4"])``; ``"1"`` -> ``(1, [])``."""
    n, _, extra = text.partition(":")
    try:
        nprocs = int(n)
    except ValueError:
        raise ValueError(f"a layout is N[:vfm generate arguments], got {text!r}") from None
    if nprocs < 1:
        raise ValueError(f"a layout needs N >= 1 processes, got {text!r}")
    return nprocs, shlex.split(extra)


def parse_log(lines: list[str]) -> dict:
    """The last batch's stage seconds and the run's header (latent shape, layout, sampler, steps) from its log."""
    batches = [tuple(float(v) for v in m.groups()) for ln in lines if (m := STAGES.search(ln))
               and "time per stage" not in ln]
    head = next((m for ln in lines if (m := HEADER.search(ln))), None)
    if not batches or head is None:
        raise ValueError("no stage times or header in the log")
    enc, den, dec = batches[-1]
    c, t, h, w, world = (int(v) for v in head.groups()[:5])
    return {"batches": len(batches), "text_encode_s": enc, "denoise_s": den, "decode_s": dec,
            "batch_s": round(enc + den + dec, 3), "latent": [c, t, h, w], "world": world,
            "layout": head.group(6), "sampler": head.group(7), "steps": int(head.group(8))}


def denoise_flops(ckpt: str, latent: list[int], steps: int, cfg_batch: int) -> float | None:
    """Model FLOPs of ``steps`` network calls on ``cfg_batch`` samples of the ``latent`` (C, T, H, W) grid."""
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.models.families import family_spec

    cfg = read_checkpoint_info(ckpt).model_config
    try:
        spec = family_spec(cfg)
    except NotImplementedError:
        return None
    pt, ph, pw = cfg.patch_size
    tokens = (latent[1] // pt) * (latent[2] // ph) * (latent[3] // pw)
    text = getattr(cfg, "text_len", 0) or 0
    return steps * spec.flops(cfg, [tokens] * cfg_batch, [text] * cfg_batch).forward


def frames_of(folder: Path):
    """The decoded frames (uint8 array) of the last batch's video in ``folder``."""
    from nemo_vfm.io.video import read_video

    last = sorted(folder.glob("batch*.mp4"))[-1]
    frames, _ = read_video(last)
    return frames.numpy() if hasattr(frames, "numpy") else frames


def run_layout(a, nprocs: int, extra: list[str], root: Path, i: int) -> dict:
    """One ``vfm generate`` run -> its row (figures, or ``error`` + ``log_tail``)."""
    out = root / f"layout{i}"
    gen = ["generate", "--ckpt", a.ckpt, "--prompts", str(root / "prompts.txt"), "--batch-size", "1",
           "--steps", str(a.steps), "--out", str(out), "--device", a.device, *shlex.split(a.gen_args), *extra]
    if nprocs == 1:
        cmd = [sys.executable, "-m", "nemo_vfm.cli.main", *gen]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nprocs),
               "-m", "nemo_vfm.cli.main", *gen]
    env = child_env(nprocs, "cuda" if a.device.startswith("cuda") else "cpu", None)
    shown = " ".join(f"{k}={v}" for k, v in env.items())
    launcher = "python" if nprocs == 1 else "torchrun"
    row: dict = {"nprocs": nprocs, "args": extra,
                 "command": f"{shown} {launcher} " + shlex.join(cmd[3 if nprocs > 1 else 1:]).replace(str(root), "TMP")}
    print(f"[{i}] {row['command']}", flush=True)
    t0 = time.perf_counter()
    log = root / f"layout{i}.log"
    rc = run_logged(cmd, {**env, "PYTHONUNBUFFERED": "1"}, log, a.timeout)
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    lines = log.read_text(errors="replace").replace("\r", "\n").splitlines()
    if rc != 0:
        return {**row, "error": rc if isinstance(rc, str) else f"exit {rc}", "log_tail": rank_tail(lines)}
    try:
        row.update(parse_log(lines))
    except ValueError as e:
        return {**row, "error": str(e), "log_tail": rank_tail(lines)}
    row["s_per_step"] = round(row["denoise_s"] / row["steps"], 4)
    flops = denoise_flops(a.ckpt, row["latent"], row["steps"], 1 if a.no_cfg else 2)
    if flops:
        row["model_tflops_per_gpu"] = round(flops / row["denoise_s"] / nprocs / 1e12, 1)
    row["video_dir"] = str(out.relative_to(root))
    return row


def compare(rows: list[dict], root: Path, given: dict | None = None) -> None:
    """Speed-up and efficiency against the first successful one-process row (or ``given``, such a row from an
    earlier run of the same settings: ``--baseline``); the video difference to it where its video is here. Rows
    compared already are left alone (each video is read once per call, not once per earlier row)."""
    import numpy as np

    base = given or next((r for r in rows if r["nprocs"] == 1 and "error" not in r), None)
    pending = [r for r in rows if "error" not in r and "denoise_speedup" not in r]
    if base is None or not pending:
        return
    ref = None if given else frames_of(root / base["video_dir"]).astype(np.float32)
    for r in pending:
        for key, stage in (("denoise", "denoise_s"), ("batch", "batch_s")):
            r[f"{key}_speedup"] = round(base[stage] / r[stage], 3)
            r[f"{key}_efficiency"] = round(base[stage] / r[stage] / r["nprocs"], 3)
        if ref is not None:
            got = frames_of(root / r["video_dir"]).astype(np.float32)
            r["video_mean_abs_diff"] = round(float(np.abs(got - ref).mean()), 3) if got.shape == ref.shape else None


def baseline_row(path: str, ckpt: str, steps: int, gen_args: str) -> dict:
    """The one-process row of an earlier ``generate_scaling`` JSON, refused unless it ran the same settings."""
    import json

    d = json.loads(Path(path).read_text())
    row = next((r for r in d.get("results", []) if r.get("nprocs") == 1 and "error" not in r), None)
    if row is None:
        raise ValueError(f"--baseline {path} has no successful one-process row")
    if (d.get("ckpt"), d.get("steps"), d.get("gen_args", "")) != (ckpt, steps, gen_args):
        raise ValueError(f"--baseline {path} ran --ckpt {d.get('ckpt')} --steps {d.get('steps')} --gen-args "
                         f"{d.get('gen_args', '')!r}; this run: --ckpt {ckpt} --steps {steps} --gen-args {gen_args!r}; "
                         "compare like with like")
    return {**row, "from": path}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="what vfm generate --ckpt takes (a Wan pipeline folder, a run...)")
    p.add_argument("--layout", action="append", required=True, help="N[:vfm generate arguments], repeatable")
    p.add_argument("--prompts", type=int, default=2, help="prompts, one batch each (the last one is timed)")
    p.add_argument("--steps", type=int, default=4, help="sampler steps per video")
    p.add_argument("--gen-args", default="", help="more vfm generate arguments for every layout (e.g. a size)")
    p.add_argument("--no-cfg", action="store_true", help="the runs use --guidance 1 (one sample per network call)")
    p.add_argument("--device", default="cuda", help="cuda or cpu")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--keep", help="keep videos and logs under this folder (default: a temporary one)")
    p.add_argument("--baseline", help="an earlier JSON of this script whose one-process row is the reference "
                   "(the one-GPU run in a call of its own)")
    p.add_argument("--commit")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    try:
        layouts = [parse_layout(t) for t in a.layout]
    except ValueError as e:
        p.error(str(e))
    if a.no_cfg:
        a.gen_args += " --guidance 1"
    try:
        given = baseline_row(a.baseline, a.ckpt, a.steps, a.gen_args) if a.baseline else None
    except (OSError, ValueError) as e:
        p.error(str(e))
    from bench.harness import environment

    command = "python bench/generate_scaling.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    env = environment("cpu", a.commit)  # the GPU's name after the runs: no CUDA context of ours beside them
    env["device"] = "cpu" if a.device == "cpu" else "cuda (name read after the runs)"
    result = {**env, "command": command, "ckpt": a.ckpt, "steps": a.steps,
              "prompts": a.prompts, "gen_args": a.gen_args, "child_env": comm_env(),
              "baseline": given and {k: given[k] for k in ("from", "command", "denoise_s", "batch_s")}}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="vfm-gen-scaling-") as tmp:
        root = Path(a.keep or tmp).resolve()
        root.mkdir(parents=True, exist_ok=True)
        words = ["a red circle moving left", "a blue square moving up", "a green circle moving right slowly"]
        (root / "prompts.txt").write_text("\n".join(words[i % len(words)] for i in range(a.prompts)) + "\n")
        for i, (n, extra) in enumerate(layouts):
            rows.append(run_layout(a, n, extra, root, i))
            compare(rows, root, given)
            write_json(a.out, result, rows)  # after every run: a later crash keeps what ran
            r = rows[-1]
            print(f"[{i}] " + (f"FAILED {r['error']}: {' | '.join(r.get('log_tail', [])[-2:])[-300:]}" if "error" in r
                               else f"denoise {r['denoise_s']:.2f}s ({r['s_per_step']:.3f} s/step), decode "
                                    f"{r['decode_s']:.2f}s, speed-up {r.get('denoise_speedup', '-')}"), flush=True)
        result.update(environment(a.device if a.device == "cpu" else "cuda", a.commit), command=command)
        write_json(a.out, result, rows)
    return 0 if rows and all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
