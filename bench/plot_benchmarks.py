"""Plot the single-GPU training benchmarks from ``bench/results`` into ``docs/benchmarks.png``.

    python bench/plot_benchmarks.py [--results bench/results] [--out docs/benchmarks.png]

Three panels: DiT-XL/2 images/s (Fast-DiT vs ours, with the 2x target), DiT-7B MFU at 8,192 tokens
(with the 55% target and NeMo's 52.5%), packed vs unpacked tokens/s at the same 8,192 tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import peak_tflops, pyplot, save_figure  # noqa: E402


def _load(folder: Path, name: str) -> dict | None:
    path = folder / name
    return json.loads(path.read_text()) if path.is_file() else None


def plot(results: Path, out: Path) -> Path:
    fig, axes = pyplot().subplots(1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [2.2, 1, 1]})
    fd = _load(results, "fastdit_h100.json")
    if fd:
        rows = [r for r in fd["results"] if "error" not in r]
        x8 = _load(results, "train_xl_fp8_h100.json")  # speed knobs beyond bf16 (another run)
        extra = [r for r in (x8 or {}).get("results", []) if "error" not in r and r["name"] != "xl-bs176-amp"]
        names = [r["name"].replace("compile ", "") for r in rows] + [f"{r['name']} (other run)" for r in extra]
        vals = [r["samples_per_s"] for r in rows + extra]
        colors = ["tab:gray" if r.get("side") == "fast-DiT" else "tab:green" for r in rows] + ["tab:olive"] * len(extra)
        ax = axes[0]
        ax.barh(names, vals, color=colors)
        best_fd = max(r["samples_per_s"] for r in rows if r.get("side") == "fast-DiT")
        ax.axvline(2 * best_fd, color="tab:red", ls="--", label=f"target 2x Fast-DiT best ({2 * best_fd:.0f})")
        for i, v in enumerate(vals):
            ax.text(v + 5, i, f"{v:.0f}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("images / s (DiT-XL/2, 256 px, one H100)")
        ax.set_title(f"DiT-XL/2 training: {fd['summary']['speedup']:.2f}x Fast-DiT", fontsize=10)
        ax.legend(loc="lower right", fontsize=8)
    b7 = _load(results, "train_7b_h100.json")
    if b7:
        b8 = _load(results, "train_7b_fp8_h100.json")  # FP8: MFU against the bf16 peak, for comparison only
        rows = [r for r in b7["results"] + (b8 or {}).get("results", []) if "error" not in r]
        ax = axes[1]
        ax.bar([r["name"].replace("7b-", "") for r in rows], [100 * r["mfu"] for r in rows], color="tab:blue")
        ax.axhline(55, color="tab:red", ls="--", label="target 55%")
        ax.axhline(52.5, color="tab:orange", ls=":", label="NeMo 52.5%")
        for i, r in enumerate(rows):
            ax.text(i, 100 * r["mfu"] + 1, f"{100 * r['mfu']:.1f}%", ha="center", fontsize=8)
        peak = peak_tflops(b7["device"])  # the table the runs' MFU used
        ax.set_ylabel(f"MFU (% of {peak:g} TFLOP/s)" if peak else "MFU (%)")
        ax.set_title("DiT-7B, 8,192 tokens, 512 text", fontsize=10)
        ax.tick_params(axis="x", labelsize=7, rotation=15)
        ax.legend(fontsize=8, loc="lower left")
    pk = _load(results, "train_packed_h100.json")
    if pk:
        rows = [r for r in pk["results"] if "error" not in r]
        ax = axes[2]
        ax.bar([r["name"].replace("-8192", "") for r in rows], [r["tokens_per_s"] / 1e3 for r in rows],
               color=["tab:purple" if "packed" in r["name"] and "un" not in r["name"] else "tab:cyan" for r in rows])
        for i, r in enumerate(rows):
            ax.text(i, r["tokens_per_s"] / 1e3 + 0.5, f"{r['tokens_per_s'] / 1e3:.1f}k", ha="center", fontsize=8)
        ax.set_ylabel("video tokens / s (thousands)")
        ax.set_title("Packed mix vs one clip, 8,192 tokens (XL width)", fontsize=10)
        ax.tick_params(axis="x", labelsize=7, rotation=15)
    fig.suptitle(f"nemo-vfm single-GPU training, {(fd or b7 or pk or {}).get('device', '')}, "
                 f"{(fd or b7 or pk or {}).get('date', '')}", fontsize=11)
    return save_figure(fig, out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--out", type=Path, default=Path(__file__).parents[1] / "docs" / "benchmarks.png")
    a = p.parse_args(argv)
    print(plot(a.results, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
