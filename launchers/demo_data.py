"""Raw clips -> ``vfm prepare`` -> Energon (a 3:1 blend, packed batches) -> training, on the CPU in minutes.

    python launchers/demo_data.py --out demo_output/data --steps 100

Writes ``OUT/raw_folder`` (mp4/png + captions) and ``OUT/raw_shards`` (webdataset mp4+json, as the
curation pipeline writes), prepares both (``vfm prepare``), blends them 3:1, trains a small DiT on
packed mixed image/video batches, and leaves ``OUT/packing.png`` (what the packed batches hold),
``OUT/experiments/energon_demo/`` (checkpoints, loss curve, sample previews) and ``OUT/summary.json``.
Running it again resumes (preparation and training both).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PATCH = (1, 2, 2)
# (frames, height, width) of the raw inputs; frames == 1 are png images
SIZES = ((8, 32, 32), (6, 32, 48), (4, 48, 32), (8, 16, 16), (5, 24, 40), (1, 32, 32), (1, 48, 48), (1, 32, 64))
TOK = {"spatial_compression": 2}
TEXT = {"dim": 64, "max_length": 12}


def plot_packing(batches, path: Path, capacity: int) -> Path:
    """One row per packed bin: each segment a bar (videos blue, images orange), padding grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.45 * len(batches) + 1.2))
    for row, b in enumerate(batches):
        for g in range(b.num_segments):
            a, end, n = int(b.cu_seqlens[g]), int(b.cu_seqlens[g + 1]), int(b.seq_lens[g])
            img = bool(b.meta[g].get("is_image"))
            ax.barh(row, n, left=a, color="tab:orange" if img else "tab:blue", edgecolor="white")
            if end > a + n:
                ax.barh(row, end - a - n, left=a + n, color="lightgrey", edgecolor="white")
            c, t, h, w = b.latent_shapes[g].tolist()
            ax.text(a + n / 2, row, f"{t}x{h}x{w}", ha="center", va="center", fontsize=7, color="white")
    ax.axvline(capacity, color="red", lw=1)
    eff = sum(b.num_real_tokens for b in batches) / (capacity * len(batches))
    ax.set_title(f"packed bins of {capacity} tokens: videos (blue), images (orange), padding (grey); "
                 f"efficiency {eff:.2f}", fontsize=9)
    ax.set_xlabel("token")
    ax.set_yticks(range(len(batches)), [f"bin {i}" for i in range(len(batches))])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="demo_output/data")
    p.add_argument("--clips", type=int, default=96, help="clips/images in the raw folder")
    p.add_argument("--shard-clips", type=int, default=32, help="clips in the curation-style shards")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--max-seq-length", type=int, default=768)
    p.add_argument("--samples", action=argparse.BooleanOptionalAction, default=True, help="write preview videos")
    args = p.parse_args(argv)

    from nemo_vfm.cli.main import main as vfm
    from nemo_vfm.data.blend import write_blend
    from nemo_vfm.data.energon_datamodule import EnergonDataModule
    from nemo_vfm.data.synthetic_inputs import write_folder, write_shards
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.lightning.data_stats import DataStatsCallback
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    out = Path(args.out)
    folder, shards = out / "raw_folder", out / "raw_shards"
    if not folder.exists():
        print(f"[1/4] writing {args.clips} raw clips and images with captions to {folder}")
        write_folder(folder, args.clips, seed=0, sizes=SIZES)
    if not shards.exists():
        print(f"[1/4] writing {args.shard_clips} clips as webdataset shards (mp4 + json) to {shards}")
        write_shards(shards, args.shard_clips, per_shard=16, seed=1, sizes=SIZES)
    common = [f"tokenizer.spatial_compression={TOK['spatial_compression']}", f"text_encoder.dim={TEXT['dim']}",
              f"text_encoder.max_length={TEXT['max_length']}", "samples_per_shard=32"]
    for src, dst in ((folder, out / "prepared_folder"), (shards, out / "prepared_shards")):
        print(f"[2/4] vfm prepare input={src} output={dst}")
        if vfm(["prepare", f"input={src}", f"output={dst}", *common]) != 0:
            return 1
    blend = write_blend(out / "blend.yaml", [(out / "prepared_folder", 3.0), (out / "prepared_shards", 1.0)])
    print(f"[3/4] Energon blend 3:1 -> {blend}")
    dm = EnergonDataModule(str(blend), micro_batch_size=1, max_seq_length=args.max_seq_length, pad_to_multiple=8,
                           packing_buffer_size=32, shuffle_buffer_size=32, seed=0)
    it = iter(dm.train_dataloader())
    plot_packing([next(it) for _ in range(12)], out / "packing.png", args.max_seq_length)
    print(f"      packed batches pictured in {out / 'packing.png'}")

    print(f"[4/4] training a small DiT for {args.steps} steps on packed mixed image/video batches")
    data = EnergonDataModule(str(blend), micro_batch_size=1, max_seq_length=args.max_seq_length, pad_to_multiple=8,
                             packing_buffer_size=32, shuffle_buffer_size=32, seed=0, log_every_n_batches=50)
    summary = train(
        model=DiTConfig(num_layers=2, hidden_size=96, num_heads=4, in_channels=12, patch_size=PATCH,
                        context_dim=TEXT["dim"]),
        data=data,
        trainer=TrainerConfig(max_steps=args.steps, accelerator="cpu", devices=1, precision="32-true",
                              log_every_n_steps=25, checkpoint_every_n_steps=100, enable_progress_bar=False,
                              callbacks=[DataStatsCallback()]),
        objective=EDM(),
        optim=OptimConfig(lr=5e-4, warmup_steps=20, schedule="cosine"),
        log=ExperimentConfig(name="energon_demo", root=str(out / "experiments"), tensorboard=False),
        sampling=SamplingConfig(num_steps=16, guidance=3.0, num_samples=4, enabled=args.samples),
        ema_decay=0.995, seed=0,
    )
    summary["packing_efficiency"] = data.packing_efficiency
    summary["packing_png"] = str(out / "packing.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"done: {json.dumps(summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
