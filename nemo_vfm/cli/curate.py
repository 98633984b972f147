"""``vfm curate INPUT OUTPUT [key=value ...]``: raw videos -> captioned clips in Energon webdataset shards.

Overrides are fields of :class:`nemo_vfm.curation.config.CurationConfig`, e.g.
``vfm curate raw/ curated/ engine=local height=256 fps=24 max_clip_s=5``. Re-running the same
command resumes: finished inputs are skipped. ``--synthetic N`` first writes N synthetic raw videos
(moving shapes with scene cuts, plus broken files) into INPUT, for a demo without data.
"""

from __future__ import annotations

import argparse
import sys

ACCEPTS_EXTRA = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="a video file or a folder searched recursively for videos")
    parser.add_argument("output", help="output folder (ledger, manifest, report, shards/)")
    parser.add_argument("--synthetic", type=int, metavar="N", default=0,
                        help="first write N synthetic raw videos (720p, with planted cuts and broken files) to INPUT")
    parser.add_argument("--synthetic-size", default="720x1280", metavar="HxW", help="size of --synthetic videos")
    parser.add_argument("--no-preview", action="store_true", help="skip OUTPUT/preview.gif (a grid of kept clips)")
    parser.epilog = "Overrides: key=value for any CurationConfig field (see docs/curation.md)."


def check_paths(input_path: str, output: str, synthetic: int) -> str | None:
    """A one-sentence problem with INPUT/OUTPUT, or None (checked before any work)."""
    from pathlib import Path

    src, dst = Path(input_path), Path(output)
    if not synthetic and not src.exists():
        return f"input {input_path!r} does not exist; give a video file or a folder of videos (or --synthetic N)"
    if synthetic and src.exists() and not src.is_dir():
        return f"--synthetic writes videos into INPUT, but {input_path!r} is a file; give a folder"
    if dst.exists() and not dst.is_dir():
        return f"output {output!r} is a file; give a folder"
    if dst.resolve() == src.resolve():
        return f"output {output!r} is the input folder; give a separate output folder (one inside the input is fine)"
    return None


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from tqdm import tqdm

    from nemo_vfm.curation.config import CurationConfig, apply_overrides

    console = Console(stderr=True, soft_wrap=True)  # messages name paths: never broken inside a word
    overrides = [a for a in args.extra if a != "--"]
    try:
        config = apply_overrides(CurationConfig(), overrides)
    except (ValueError, TypeError) as e:
        console.print(f"[red]error:[/red] {e}")
        return 2
    if args.synthetic < 0:
        console.print(f"[red]error:[/red] --synthetic must be >= 0, got {args.synthetic}")
        return 2
    problem = check_paths(args.input, args.output, args.synthetic)
    if problem:
        console.print(f"[red]error:[/red] {problem}")
        return 2
    if args.synthetic:
        from nemo_vfm.curation.synthetic import make_raw_dataset

        try:
            h, w = (int(x) for x in args.synthetic_size.lower().split("x"))
            if h < 16 or w < 16:
                raise ValueError
        except ValueError:
            console.print(f"[red]error:[/red] --synthetic-size must look like 720x1280 (each >= 16), "
                          f"got {args.synthetic_size!r}")
            return 2
        make_raw_dataset(args.input, num_videos=args.synthetic, height=h, width=w, bad_files=True)
    from nemo_vfm.curation.pipeline import curate
    from nemo_vfm.curation.report import report_table

    bar = tqdm(unit="video", desc="curate", dynamic_ncols=True)
    totals = {"kept": 0, "filtered": 0, "errors": 0, "bad inputs": 0}

    def on_start(total: int, finished: int) -> None:
        bar.reset(total=total)
        bar.update(finished)
        if finished:
            bar.write(f"resuming: {finished} of {total} inputs already finished", file=sys.stderr)

    def on_input_done(rel: str, row: dict) -> None:
        for k in ("kept", "filtered", "errors"):
            totals[k] += row[k]
        totals["bad inputs"] += row["status"] == "error"
        bar.set_postfix(clips=totals["kept"], filtered=totals["filtered"], errors=totals["errors"] + totals["bad inputs"])
        bar.update(1)

    try:
        result = curate(args.input, args.output, config, on_start=on_start, on_input_done=on_input_done)
    except (FileNotFoundError, ValueError) as e:
        bar.close()
        console.print(f"[red]error:[/red] {e}")
        return 2
    except (OSError, RuntimeError) as e:  # a full disk, a failed write, energon indexing: the run stopped
        bar.close()
        console.print(f"[red]error:[/red] curation stopped: {e}")
        return 1
    bar.close()
    out = Console(width=max(Console().width, 130))
    if result.report is not None:
        out.print(report_table(result.report))
    c = result.counts
    if not args.no_preview:
        from nemo_vfm.curation.preview import write_preview

        try:
            preview = write_preview(result.output)
        except (OSError, ValueError) as e:  # a preview is a convenience: the curated data is complete
            console.print(f"[yellow]warning:[/yellow] no preview written: {e}")
            preview = None
        if preview is not None:
            out.print(f"preview of the kept clips: {preview}")
    out.print(f"inputs: {c['inputs_done']} done, {c['inputs_error']} unreadable; clips: {c['kept']} kept, "
                    f"{c['filtered']} filtered, {c['error']} errors -> {len(result.shards)} shard(s) in "
                    f"{result.shards_dir} (ledger: {result.output / 'manifest.jsonl'})")
    return 0
