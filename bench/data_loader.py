"""CPU benchmark of the Energon data path: loader samples/s (bucketed and packed, 0 and 2 workers) and
packing efficiency (first-fit-decreasing) against buffer size and bin capacity.

    python bench/data_loader.py --out bench/results/data_loader_cpu.json [--clips 240] [--batches 60]

The dataset is made here: synthetic clips and images of several lengths and resolutions, prepared with
``vfm prepare`` (identity tokenizer, 2x2 space-to-depth; hash text encoder). A second table runs FFD
alone on a long-tailed length distribution (images, short and long clips) to show how efficiency
grows with the packing buffer.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import environment  # noqa: E402

# (frames, height, width): images and clips of several lengths and aspect ratios
SIZES = ((8, 32, 32), (6, 32, 48), (4, 48, 32), (8, 16, 16), (12, 24, 24), (1, 32, 32), (1, 48, 48), (1, 32, 64),
         (5, 24, 40), (1, 16, 16))


def loader_rate(path: str, batches: int, **kw) -> dict:
    from nemo_vfm.data.batch import PackedBatch
    from nemo_vfm.data.energon_datamodule import EnergonDataModule

    dm = EnergonDataModule(path, shuffle_buffer_size=64, **kw)
    loader = dm.train_dataloader()
    it = iter(loader)
    first = next(it)  # worker start-up and buffer filling are not throughput
    dm.on_before_batch_transfer(first, 0)
    t0 = time.perf_counter()
    samples = tokens = 0
    for _ in range(batches):
        b = next(it)
        dm.on_before_batch_transfer(b, 0)  # includes the per-batch state snapshot that makes resume exact
        if isinstance(b, PackedBatch):
            samples += b.num_segments
            tokens += b.num_real_tokens
        else:
            samples += len(b)
            tokens += len(b) * int(b.latents[0, 0].numel() // 4)
    dt = time.perf_counter() - t0
    out = {"samples_per_s": samples / dt, "batches_per_s": batches / dt, "real_tokens_per_s": tokens / dt}
    if kw.get("max_seq_length"):
        out["packing_efficiency"] = loader.packing_efficiency
    return out


def ffd_table(seed: int = 0) -> list[dict]:
    from nemo_vfm.data.packing import first_fit_decreasing, packing_efficiency

    rng = random.Random(seed)
    rows = []
    for cap in (2048, 4096, 8192):
        for buf in (8, 32, 128, 512):
            effs = []
            for _ in range(20):
                lengths = [rng.choice((rng.randint(64, 256), rng.randint(256, 1024), rng.randint(1024, 2048)))
                           for _ in range(buf)]
                bins, _ = first_fit_decreasing(lengths, cap)
                effs.append(packing_efficiency(bins, lengths, cap))
            rows.append({"max_seq_length": cap, "buffer": buf, "efficiency": sum(effs) / len(effs)})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench/results/data_loader_cpu.json")
    p.add_argument("--clips", type=int, default=240)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--data", default=None, help="reuse a prepared folder instead of making one")
    args = p.parse_args()

    import torch

    from nemo_vfm.data.prepare import PrepareConfig, prepare
    from nemo_vfm.data.synthetic_inputs import write_folder

    tmp = Path(tempfile.mkdtemp(prefix="vfm_bench_data_"))
    data = args.data
    prep = {}
    if data is None:
        raw = write_folder(tmp / "raw", args.clips, seed=0, sizes=SIZES)
        t0 = time.perf_counter()
        prepare(PrepareConfig(input=str(raw), output=str(tmp / "prepared"), tokenizer_kwargs={"spatial_compression": 2},
                              text_encoder_kwargs={"dim": 64, "max_length": 12}, samples_per_shard=64,
                              progress=False))
        prep = {"clips": args.clips, "prepare_clips_per_s": args.clips / (time.perf_counter() - t0)}
        data = str(tmp / "prepared")

    runs = []
    for workers in (0, 2):
        runs.append({"mode": "buckets", "micro_batch_size": 8, "num_workers": workers,
                     **loader_rate(data, args.batches, micro_batch_size=8, num_workers=workers)})
        for cap in (1024, 4096):
            runs.append({"mode": "packed", "max_seq_length": cap, "pad_to_multiple": 8, "packing_buffer_size": 64,
                         "num_workers": workers,
                         **loader_rate(data, args.batches, micro_batch_size=1, max_seq_length=cap, pad_to_multiple=8,
                                       packing_buffer_size=64, num_workers=workers)})
    result = {**environment("cpu"), "device": f"CPU ({platform.processor() or platform.machine()}), torch {torch.__version__}",
              "threads": torch.get_num_threads(), "prepare": prep, "loader": runs, "ffd": ffd_table()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print("| mode | workers | max_seq_length | samples/s | real tokens/s | packing eff. |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['mode']} | {r['num_workers']} | {r.get('max_seq_length', '-')} | {r['samples_per_s']:.0f} | "
              f"{r['real_tokens_per_s']:.0f} | {r.get('packing_efficiency', float('nan')):.3f} |")
    print("\nFFD efficiency (long-tailed lengths 64..2048):")
    for r in result["ffd"]:
        print(f"  capacity {r['max_seq_length']:5d} buffer {r['buffer']:4d}: {r['efficiency']:.3f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
