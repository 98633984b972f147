"""A run's folder stays right (issue 29, item 7): metrics reach metrics.jsonl at every checkpoint, two runs
cannot share a folder, and a stop names a checkpoint whose weights are finite."""

import json
from pathlib import Path

import lightning as L
import pytest
import torch

from nemo_vfm.io.run_lock import RunLockedError
from nemo_vfm.lightning.nonfinite import NonFiniteError, checkpoint_finite


def _train(root: Path, steps: int, *, callbacks=(), **trainer_kw):
    from nemo_vfm.data.synthetic import ShapesDataModule
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.models.dit.flavors import dit_config
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    kw = dict(checkpoint_every_n_steps=2, keep_last_n_checkpoints=3, precision="32-true", accelerator="cpu",
              devices=1, enable_progress_bar=False, log_every_n_steps=1, gradient_clip_val=None)
    kw.update(trainer_kw)
    return train(model=dit_config("tiny", in_channels=12, context_dim=16, patch_size=(1, 2, 2)),
                 data=ShapesDataModule(num_clips=8, num_frames=2, height=16, width=16, batch_size=4,
                                       tokenizer_kwargs={"spatial_compression": 2}, text_encoder_kwargs={"dim": 16}),
                 trainer=TrainerConfig(max_steps=steps, callbacks=list(callbacks), **kw),
                 optim=OptimConfig(lr=1e-3, warmup_steps=1), log=ExperimentConfig(name="run", root=str(root)),
                 sampling=SamplingConfig(enabled=False), ema_decay=0.9, seed=3)


class Killed(Exception):
    pass


class StopAt(L.Callback):
    """Records metrics.jsonl as it is when the given (1-based) step starts, then ends the run like a kill would."""

    def __init__(self, step: int, path: Path):
        self.step, self.path, self.rows = step, path, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step + 1 == self.step:
            self.rows = [json.loads(line) for line in self.path.read_text().splitlines()] if self.path.exists() else []
            raise Killed  # the rows on disk were read before this: what a SIGKILL here would leave


def test_metrics_are_on_disk_at_each_checkpoint(tmp_path):
    """log_every_n_steps=10 buffers the rows; the step-4 checkpoint writes them, so a kill at step 5 loses none."""
    stop = StopAt(5, tmp_path / "run" / "metrics.jsonl")
    with pytest.raises(Killed):
        _train(tmp_path, 6, callbacks=[stop], log_every_n_steps=10)
    assert [r["step"] for r in stop.rows] == [1, 2, 3, 4] and all("loss" in r for r in stop.rows)


def test_a_second_run_in_the_same_folder_is_refused_while_the_first_runs(tmp_path, lock_holder):
    exp = tmp_path / "run"
    holder = lock_holder(exp)
    with pytest.raises(RunLockedError, match=f"{exp} is in use by pid {holder.pid} .*another log.name"):
        _train(tmp_path, 2)
    assert not exp.exists()  # nothing written
    holder.kill()
    holder.wait()
    with pytest.warns(UserWarning, match="taking over the lock"):
        assert _train(tmp_path, 2)["step"] == 2
    assert not (tmp_path / ".run.lock").exists()  # released at the end


def _poison(ckpt: Path) -> None:
    state = torch.load(ckpt, weights_only=False)
    name = next(k for k in state["state_dict"] if k.startswith("model."))
    state["state_dict"][name].view(-1)[0] = float("nan")
    torch.save(state, ckpt)


def test_resuming_a_nan_checkpoint_stops_naming_the_newest_finite_one(tmp_path):
    _train(tmp_path, 4)
    ckpts = tmp_path / "run" / "checkpoints"
    _poison(ckpts / "step=00000004.ckpt")  # written by something without the guard
    with pytest.raises(NonFiniteError) as e:
        _train(tmp_path, 6)
    msg = str(e.value)
    assert msg.startswith(f"cannot resume from {ckpts / 'step=00000004.ckpt'}: its weights or optimizer state hold")
    assert f"resume from {ckpts / 'step=00000002.ckpt'} (re-run the same command) (moved step=00000004.ckpt " \
           "aside to *.nonfinite" in msg
    assert (ckpts / "step=00000004.ckpt.nonfinite").exists()
    assert _train(tmp_path, 6)["step"] == 6  # the same command resumes from step 2


def test_no_finite_checkpoint_is_said_so(tmp_path):
    _train(tmp_path, 2)
    _poison(tmp_path / "run" / "checkpoints" / "step=00000002.ckpt")
    with pytest.raises(NonFiniteError, match="no checkpoint of this run holds finite weights .*starts over"):
        _train(tmp_path, 4)


def test_checkpoint_finite_reads_sharded_folders(tmp_path):
    import torch.distributed.checkpoint as dcp

    state = {"state_dict": {"model.w": torch.ones(3), "model.b": torch.zeros(2)}}
    dcp.save(state, checkpoint_id=str(tmp_path / "good"), no_dist=True)
    assert checkpoint_finite(tmp_path / "good") is True
    state["state_dict"]["model.b"][1] = float("inf")
    dcp.save(state, checkpoint_id=str(tmp_path / "bad"), no_dist=True)
    assert checkpoint_finite(tmp_path / "bad") is False
    assert checkpoint_finite(tmp_path / "missing") is None


def test_final_checkpoint_false_writes_none_after_the_last_step(tmp_path):
    out = _train(tmp_path, 3, final_checkpoint=False)  # step 2 checkpointed by the cadence, step 3 not
    assert out["step"] == 3 and out["checkpoint"] is None
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("*.ckpt")) == ["step=00000002.ckpt"]
    out = _train(tmp_path / "default", 3)
    assert Path(out["checkpoint"]).name == "step=00000003.ckpt" and Path(out["checkpoint"]).exists()
