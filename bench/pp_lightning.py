"""Pipeline parallelism through Lightning on GPUs (torchrun, NCCL): a small DiT trained for 3 steps by
``trainer.fit`` with ``VFMParallelStrategy`` under PP layouts, against the same training on one device.

    torchrun --nproc-per-node 2 bench/pp_lightning.py                  # PP2 1F1B / interleaved / GPipe
    torchrun --nproc-per-node 4 bench/pp_lightning.py                  # PP4, PP2xTP2 (SP), PP2xCP2, PP2xFSDP2
    torchrun --nproc-per-node 2 bench/pp_lightning.py --device cpu     # gloo, for a dry run

Rank 0 first trains the reference on one device in a subprocess (fp32, TF32 off). Every layout then trains
on all ranks; fp32 layouts are compared with the reference: per-step losses, and the final weights and EMA
weights read back from the layout's sharded checkpoint. Layouts marked "runs" (``bf16-mixed``, FSDP with bf16
parameters) only have to finish with finite losses. Rank 0 prints a markdown table and writes JSON to
``$OUT`` (or ``bench/results``); the runs' checkpoints go to a temp folder (``--out``). Needs torch and
lightning, not fiddle, nemo-run or energon.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

STEPS = 3
FP32 = dict(param_dtype=None)
LAYOUTS = {  # name -> (strategy kwargs, precision, compared with the reference)
    2: {
        "PP2 1F1B": (dict(pipeline_model_parallel_size=2, **FP32), "32-true", True),
        "PP2 interleaved (4 stages)": (dict(pipeline_model_parallel_size=2, pipeline_schedule="interleaved", **FP32),
                                       "32-true", True),
        "PP2 GPipe": (dict(pipeline_model_parallel_size=2, pipeline_schedule="gpipe", **FP32), "32-true", True),
        "PP2 1F1B bf16-mixed": (dict(pipeline_model_parallel_size=2, **FP32), "bf16-mixed", False),
    },
    4: {
        "PP4 1F1B": (dict(pipeline_model_parallel_size=4, **FP32), "32-true", True),
        "PP2xTP2 (SP)": (dict(pipeline_model_parallel_size=2, tensor_model_parallel_size=2, sequence_parallel=True,
                              fsdp=False, **FP32), "32-true", True),
        "PP2xCP2": (dict(pipeline_model_parallel_size=2, context_parallel_size=2, fsdp=False, **FP32), "32-true", True),
        "PP2xFSDP2 bf16 params, bf16-mixed": (dict(pipeline_model_parallel_size=2, param_dtype="bf16"), "bf16-mixed",
                                              False),
    },
}
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
                 "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE")


def fit(out: Path, devices: int, accelerator: str, strategy, precision: str) -> list[float]:
    """Train 3 steps and save a checkpoint at ``out/final.ckpt``; returns the per-step losses."""
    import lightning as L

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.lightning.module import DiffusionModule, OptimConfig
    from nemo_vfm.models.dit.model import DiTConfig

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    L.seed_everything(7, verbose=False)
    cfg = DiTConfig(num_layers=4, hidden_size=64, num_heads=4, in_channels=4, context_dim=32, adaln_lora_rank=8)
    # AdamW with a large eps: updates linear in the gradients, so round-off is not amplified (see the tests)
    module = DiffusionModule(cfg, EDM(), OptimConfig(lr=0.5, eps=10.0, warmup_steps=2), ema_decay=0.9, seed=7)
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=8, width=8, context_dim=32, context_length=5,
                                batch_size=4, num_samples=32)
    losses = []

    class Losses(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"]))

    trainer = L.Trainer(devices=devices, accelerator=accelerator, strategy=strategy, precision=precision,
                        max_steps=STEPS, gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                        limit_val_batches=0, num_sanity_val_steps=0, callbacks=[Losses()], default_root_dir=str(out))
    trainer.fit(module, datamodule=data)
    trainer.save_checkpoint(out / "final.ckpt")
    return losses


def weights(ckpt: Path) -> dict:
    from nemo_vfm.parallel.checkpoint import consolidated_state_dict

    if ckpt.is_dir():
        return consolidated_state_dict(ckpt, prefix="state_dict.")
    from nemo_vfm.io.safe_load import safe_load

    return {k: v.float().cpu() for k, v in safe_load(ckpt)["state_dict"].items()}


def compare(got_loss, ref_loss, got_w, ref_w) -> dict:
    def rel(prefix):
        return max(((got_w[k] - v).abs().max() / v.abs().max().clamp_min(1e-12)).item()
                   for k, v in ref_w.items() if k.startswith(prefix))

    missing = sorted(set(ref_w) - set(got_w))
    if missing:
        return {"error": f"missing from the checkpoint: {missing[:3]}"}
    return {"loss": max(abs(a - b) / abs(b) for a, b in zip(got_loss, ref_loss)), "weights": rel("model."),
            "ema": rel("ema.")}


def run_reference(out: Path, device: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_ENV}
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    subprocess.run([sys.executable, __file__, "--reference", "--device", device, "--out", str(out)], env=env,
                   check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--out", default=None, help="working folder for the runs' checkpoints (default: a temp folder)")
    p.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    results_dir = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    work = Path(args.out or Path(tempfile.gettempdir()) / "pp_lightning_work")
    accelerator = "gpu" if args.device == "cuda" else "cpu"
    if args.reference:  # one device, no strategy
        losses = fit(work / "reference", 1, accelerator, "auto", "32-true")
        (work / "reference" / "losses.json").write_text(json.dumps(losses))
        return

    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world not in LAYOUTS:
        raise SystemExit(f"run under torchrun with 2 or 4 processes (got {world}).")
    if rank == 0:
        run_reference(work, args.device)
    got = {}
    for name, (kw, precision, compared) in LAYOUTS[world].items():
        folder = work / name.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
        got[name] = (folder, fit(folder, world, accelerator, VFMParallelStrategy(**kw), precision), compared)
    if rank != 0:
        return
    ref_loss = json.loads((work / "reference" / "losses.json").read_text())
    ref_w = weights(work / "reference" / "final.ckpt")
    rows = {}
    print(f"\n| layout ({world}x {args.device}) | losses | loss | weights | EMA |\n|---|---|---|---|---|")
    for name, (folder, losses, compared) in got.items():
        row = {"losses": losses}
        if compared:
            row.update(compare(losses, ref_loss, weights(folder / "final.ckpt"), ref_w))
        else:
            row["finite"] = all(math.isfinite(v) for v in losses)
        rows[name] = row
        if compared:
            cells = [f"{row[k]:.1e}" if k in row else row.get("error", "-") for k in ("loss", "weights", "ema")]
        else:
            cells = ["runs" if row["finite"] else "NOT FINITE", "-", "-"]
        print(f"| {name} | {', '.join(f'{v:.4f}' for v in losses)} | " + " | ".join(cells) + " |")
    print(f"| reference (1 {args.device}) | {', '.join(f'{v:.4f}' for v in ref_loss)} | | | |")
    ok = all(r.get("finite", True) and all(r.get(k, 0) < 1e-5 for k in ("loss", "weights", "ema")) and "error" not in r
             for r in rows.values())
    print(f"all layouts {'match the reference within 1e-5 (relative)' if ok else 'DO NOT all match'}")
    results_dir.mkdir(parents=True, exist_ok=True)
    dest = results_dir / f"pp_lightning_{world}{args.device}.json"
    dest.write_text(json.dumps({"world": world, "device": args.device, "torch": torch.__version__, "ok": ok,
                                "reference_losses": ref_loss, "layouts": rows}, indent=1))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
