"""Side-by-side bars of ``bench/scaling.py`` results: per-GPU tokens/s with MFU, grouped into comparisons.

    python bench/plot_scaling_rows.py --out docs/scaling_2xh100.png --title "2 x H100, 2026-11-26" \\
        "MoE vs dense|EC-DiT-1B EP2=bench/results/scaling_moe_ep2_2xh100_0c5d666.json" \\
        "MoE vs dense|dense DiT-Llama-1B=bench/results/scaling_dense1b_2xh100_0c5d666.json"

Each bar is ``GROUP|LABEL=PATH[@N]``: the run at N processes of that JSON (default: its largest N that ran).
A run that failed is drawn as an empty bar labelled with its error, never as a number.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import pyplot, save_figure  # noqa: E402


def read_bar(spec: str) -> dict:
    """``GROUP|LABEL=PATH[@N]`` -> {group, label, tokens, mfu, step_ms, error}."""
    head, _, path = spec.rpartition("=")
    group, _, label = head.partition("|")
    if not path or not label:
        raise ValueError(f"bar {spec!r}: write GROUP|LABEL=PATH[@N]")
    path, _, n = path.partition("@")
    runs = json.loads(Path(path).read_text())["results"]
    if n:
        runs = [r for r in runs if r["nprocs"] == int(n)]
        if not runs:
            raise ValueError(f"bar {spec!r}: {path} has no run at N={n}")
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"group": group, "label": label, "error": runs[-1]["error"][:60]}
    r = max(ok, key=lambda r: r["nprocs"])
    return {"group": group, "label": f"{label} (N={r['nprocs']})", "tokens": r["tokens_per_s_per_gpu"],
            "mfu": r.get("mfu"), "step_ms": 1e3 * r["step_s"]}


def plot(bars: list[dict], out: Path, title: str) -> Path:
    groups = list(dict.fromkeys(b["group"] for b in bars))
    sizes = [sum(b["group"] == g for b in bars) for g in groups]
    fig, axes = pyplot().subplots(len(groups), 1, figsize=(10, 0.55 * sum(sizes) + 1.1 * len(groups)), squeeze=False,
                             gridspec_kw={"height_ratios": sizes})
    for ax, group in zip(axes[:, 0], groups):
        rows = [b for b in bars if b["group"] == group]
        vals = [b.get("tokens", 0.0) for b in rows]
        ax.barh([b["label"] for b in rows], vals, color=["tab:gray" if "error" in b else "tab:green" for b in rows])
        for i, b in enumerate(rows):
            mfu = f", MFU {100 * b['mfu']:.1f}%" if b.get("mfu") else ""
            text = f"failed: {b['error']}" if "error" in b else f" {b['tokens']:,.0f} ({b['step_ms']:.0f} ms{mfu})"
            ax.text(vals[i], i, text, va="center", fontsize=8)
        ax.set_xlim(0, 1.5 * max(vals + [1.0]))
        ax.invert_yaxis()
        ax.set_title(group)
        ax.set_xlabel("tokens/s per GPU")
    fig.suptitle(title)
    return save_figure(fig, out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bars", nargs="+", help="GROUP|LABEL=PATH[@N]")
    p.add_argument("--out", required=True)
    p.add_argument("--title", default="")
    a = p.parse_args(argv)
    print(f"wrote {plot([read_bar(s) for s in a.bars], Path(a.out), a.title)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
