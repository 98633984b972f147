"""Crash safety: a run killed with SIGKILL and started again continues from its last complete
checkpoint, and with fixed seeds its later losses, final weights and EMA weights equal the uninterrupted run's."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from nemo_vfm.io.safe_load import safe_load
from nemo_vfm.lightning.callbacks import read_metrics
from nemo_vfm.lightning.checkpointing import AtomicCheckpointIO, latest_checkpoint

SCRIPT = textwrap.dedent("""
    import sys, time, torch
    torch.set_num_threads(1)
    import lightning as L
    from nemo_vfm.data.synthetic import ShapesDataModule
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.models.dit.flavors import dit_config
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    class SlowDown(L.Callback):  # gives the test time to kill the process between checkpoints
        def on_train_batch_end(self, *a):
            time.sleep(float(sys.argv[3]))

    train(model=dit_config("tiny", in_channels=12, context_dim=16, patch_size=(1, 2, 2)),
          data=ShapesDataModule(num_clips=24, num_frames=2, height=16, width=16, batch_size=4,
                                tokenizer_kwargs={"spatial_compression": 2}, text_encoder_kwargs={"dim": 16}),
          trainer=TrainerConfig(max_steps=int(sys.argv[2]), checkpoint_every_n_steps=2, keep_last_n_checkpoints=2,
                                precision="32-true", accelerator="cpu", devices=1, enable_progress_bar=False,
                                log_every_n_steps=1, callbacks=[SlowDown()]),
          optim=OptimConfig(lr=1e-3, warmup_steps=2), log=ExperimentConfig(name="run", root=sys.argv[1]),
          sampling=SamplingConfig(enabled=False), ema_decay=0.9, seed=7)
""")


def _start(root: Path, steps: int, delay: float, script: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(script), str(root), str(steps), str(delay)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_sigkill_then_restart_matches_uninterrupted(tmp_path):
    script = tmp_path / "train_script.py"
    script.write_text(SCRIPT)
    steps = 8

    ref = _start(tmp_path / "ref", steps, 0.0, script)
    _, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err[-3000:]

    victim = _start(tmp_path / "crash", steps, 0.5, script)
    ckpts = tmp_path / "crash" / "run" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline:
        found = latest_checkpoint(ckpts)
        if found is not None and int(found.stem.split("=")[1]) >= 4:
            break
        assert victim.poll() is None, victim.stderr.read()[-3000:]
        time.sleep(0.1)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    killed_at = int(latest_checkpoint(ckpts).stem.split("=")[1])
    assert 4 <= killed_at < steps

    resumed = _start(tmp_path / "crash", steps, 0.0, script)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]

    ref_loss = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "ref" / "run" / "metrics.jsonl")}
    got_loss = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "crash" / "run" / "metrics.jsonl")}
    assert latest_checkpoint(ckpts).name == f"step={steps:08d}.ckpt"
    for step in range(killed_at + 1, steps + 1):
        assert got_loss[step] == pytest.approx(ref_loss[step], rel=1e-6, abs=1e-7), step
    final = f"run/checkpoints/step={steps:08d}.ckpt"  # the weights and the EMA weights too
    want = safe_load(tmp_path / "ref" / final)["state_dict"]  # our checkpoints load weights-only
    got = safe_load(tmp_path / "crash" / final)["state_dict"]
    assert any(k.startswith("ema.") for k in want)
    for k, v in want.items():
        assert torch.allclose(got[k], v, rtol=1e-6, atol=1e-8), k


def test_atomic_save_never_leaves_a_partial_checkpoint(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    io.save_checkpoint({"w": torch.ones(3)}, tmp_path / "step=00000002.ckpt")

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"w": torch.zeros(3)}, tmp_path / "step=00000004.ckpt")
    assert not (tmp_path / "step=00000004.ckpt").exists()
    assert latest_checkpoint(tmp_path).name == "step=00000002.ckpt"
    (tmp_path / ".step=00000006.ckpt.tmp123").write_bytes(b"partial")  # a stray temp file is ignored
    assert latest_checkpoint(tmp_path).name == "step=00000002.ckpt"


def test_one_process_vfm_strategy_resumes_with_the_uninterrupted_losses(tmp_path):
    """The GPU recipes' strategy in one process (nothing to shard, so no DTensors) resumes its sharded checkpoint:
    4 steps in one go, and 2 steps then the same call with max_steps=4, give the same losses and weights."""
    import torch.distributed as dist

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.inference.checkpoint import full_state_dict, read_checkpoint_info
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.models.dit.flavors import dit_config
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    def run(name, steps):
        out = train(model=dit_config("tiny", in_channels=4, context_dim=8),
                    data=MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=8,
                                              context_length=4, batch_size=2, num_samples=16),
                    trainer=TrainerConfig(max_steps=steps, checkpoint_every_n_steps=2, accelerator="cpu", devices=1,
                                          precision="32-true", strategy=VFMParallelStrategy(), log_every_n_steps=1,
                                          enable_progress_bar=False),
                    optim=OptimConfig(lr=1e-3, warmup_steps=0), sampling=SamplingConfig(enabled=False),
                    log=ExperimentConfig(name=name, root=str(tmp_path), tensorboard=False), ema_decay=0.9, seed=3)
        dist.destroy_process_group()
        return out

    whole = run("whole", 4)
    run("cut", 2)
    cut = run("cut", 4)
    assert Path(cut["checkpoint"]).is_dir()  # a sharded folder, even in one process
    losses = {name: {r["step"]: r["loss"] for r in read_metrics(tmp_path / name / "metrics.jsonl") if "loss" in r}
              for name in ("whole", "cut")}
    assert losses["cut"] == pytest.approx(losses["whole"], rel=1e-6) and sorted(losses["cut"]) == [1, 2, 3, 4]
    for ema in (False, True):
        want = full_state_dict(read_checkpoint_info(whole["checkpoint"]), use_ema=ema)
        got = full_state_dict(read_checkpoint_info(cut["checkpoint"]), use_ema=ema)
        assert all(torch.allclose(got[k], v, rtol=1e-6, atol=1e-8) for k, v in want.items())
