"""A full disk while writing a checkpoint: torch.save's zip writer raises a ``RuntimeError`` ("[enforce fail at
inline_container.cc:672] . unexpected pos ..."), not an ``OSError``; the run still stops with one sentence saying
the disk is full, the folder's free space, and which earlier checkpoint is intact (file and DCP-folder saves)."""

import errno
import re
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nemo_vfm.io.checkpoint_files import latest_checkpoint, verify_checkpoint
from nemo_vfm.lightning import checkpointing
from nemo_vfm.lightning.checkpointing import AtomicCheckpointIO, CheckpointWriteError

ZIP_ERROR = "[enforce fail at inline_container.cc:672] . unexpected pos 2947008 vs 2946896"
Usage = namedtuple("Usage", "total used free")


def _zip_writer_fails(checkpoint, f):
    f.write(b"x" * 1000)
    raise RuntimeError(ZIP_ERROR)


@pytest.fixture
def nearly_full(monkeypatch):
    monkeypatch.setattr(checkpointing.shutil, "disk_usage", lambda p: Usage(3 * 2**20, 3 * 2**20 - 4096, 4096))


def test_zip_writer_error_on_a_full_disk_says_so(tmp_path, monkeypatch, nearly_full):
    io = AtomicCheckpointIO()
    io.save_checkpoint({"w": torch.ones(8)}, tmp_path / "step=00000002.ckpt")
    monkeypatch.setattr(checkpointing, "_write", _zip_writer_fails)
    with pytest.raises(CheckpointWriteError) as e:
        io.save_checkpoint({"w": torch.ones(8)}, tmp_path / "step=00000004.ckpt")
    msg = str(e.value)
    assert f"could not write checkpoint {tmp_path / 'step=00000004.ckpt'}: the disk is full ({ZIP_ERROR}, " \
           f"0.0 MiB free in {tmp_path})" in msg
    assert f"the previous checkpoint {tmp_path / 'step=00000002.ckpt'} is intact" in msg
    assert e.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step=00000002.ckpt"]  # temporary file removed


def test_zip_writer_error_with_room_left_is_a_write_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpointing, "_write", _zip_writer_fails)
    with pytest.raises(CheckpointWriteError, match=rf"the write failed \({re.escape(ZIP_ERROR)}, [\d.]+ MiB free in "
                                                   rf"{tmp_path}\); no earlier checkpoint exists"):
        AtomicCheckpointIO().save_checkpoint({"w": torch.ones(8)}, tmp_path / "step=00000002.ckpt")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_real_full_device(tmp_path, monkeypatch):
    """torch.save onto /dev/full (every write fails with ENOSPC) raises the zip writer's own RuntimeError."""
    monkeypatch.setattr(checkpointing, "_write", lambda checkpoint, f: torch.save(checkpoint, "/dev/full"))
    with pytest.raises(CheckpointWriteError, match=r"inline_container.cc.*unexpected pos") as e:
        AtomicCheckpointIO().save_checkpoint({"w": torch.zeros(100_000)}, tmp_path / "step=00000002.ckpt")
    assert isinstance(e.value.__cause__, RuntimeError) and not list(tmp_path.iterdir())


def test_other_errors_are_not_dressed_up(tmp_path, monkeypatch):
    def bug(checkpoint, f):
        raise RuntimeError("a bug in a callback's state")

    monkeypatch.setattr(checkpointing, "_write", bug)
    with pytest.raises(RuntimeError, match="a bug in a callback's state"):
        AtomicCheckpointIO().save_checkpoint({}, tmp_path / "step=00000002.ckpt")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("wrapped", [False, True])
def test_sharded_save_zip_writer_error(tmp_path, nearly_full, wrapped):
    """A DCP folder save: Lightning's meta.pt (torch.save: a bare RuntimeError) or a rank's shard (wrapped in DCP's
    CheckpointException) fails; the incomplete folder is removed and the previous checkpoint named."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    prev = tmp_path / "step=00000002.ckpt"
    dcp.save({"state_dict": {"model.w": torch.ones(8)}}, checkpoint_id=str(prev), no_dist=True)
    target = tmp_path / "step=00000004.ckpt"

    def failing_save(path, weights_only=False):
        Path(path).mkdir()
        (Path(path) / "__0_0.distcp").write_bytes(b"partial")
        err = RuntimeError(ZIP_ERROR)
        raise CheckpointException("save failed", {0: (err, None)}) if wrapped else err

    trainer = SimpleNamespace(save_checkpoint=failing_save, is_global_zero=True, global_step=4, loggers=[])
    with pytest.raises(CheckpointWriteError, match=rf"{target}: the disk is full \(.*unexpected pos.*0.0 MiB free.*\); "
                                                   rf"the previous checkpoint {prev} is intact"):
        checkpointing.RotatingCheckpoint(tmp_path, 2, 2)._save_checkpoint(trainer, str(target))
    assert not target.exists() and verify_checkpoint(prev, deep=True) is None


def test_training_stops_with_the_sentence(tmp_path, monkeypatch):
    """Through train(): the step-4 save hits the full disk; step 2's checkpoint is named, intact, and resumable."""
    from nemo_vfm.data.synthetic import ShapesDataModule
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.models.dit.flavors import dit_config
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    real = checkpointing._write

    def full_at_step_4(checkpoint, f):
        if checkpoint["global_step"] == 4:
            _zip_writer_fails(checkpoint, f)
        real(checkpoint, f)

    monkeypatch.setattr(checkpointing, "_write", full_at_step_4)
    monkeypatch.setattr(checkpointing.shutil, "disk_usage", lambda p: Usage(2**30, 2**30 - 4096, 4096))
    with pytest.raises(CheckpointWriteError) as e:
        train(model=dit_config("tiny", in_channels=12, context_dim=16, patch_size=(1, 2, 2)),
              data=ShapesDataModule(num_clips=8, num_frames=2, height=16, width=16, batch_size=4,
                                    tokenizer_kwargs={"spatial_compression": 2}, text_encoder_kwargs={"dim": 16}),
              trainer=TrainerConfig(max_steps=6, checkpoint_every_n_steps=2, precision="32-true", accelerator="cpu",
                                    devices=1, enable_progress_bar=False, log_every_n_steps=1),
              optim=OptimConfig(lr=1e-3, warmup_steps=1), log=ExperimentConfig(name="run", root=str(tmp_path)),
              sampling=SamplingConfig(enabled=False), seed=3)
    ckpts = tmp_path / "run" / "checkpoints"
    assert f"step=00000004.ckpt: the disk is full ({ZIP_ERROR}, 0.0 MiB free" in str(e.value)
    assert f"the previous checkpoint {ckpts / 'step=00000002.ckpt'} is intact" in str(e.value)
    assert latest_checkpoint(ckpts, deep=True).name == "step=00000002.ckpt"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step=00000002.ckpt"]
