"""Training on Energon data, interrupted mid-epoch and resumed from the checkpoint, sees exactly the samples
and losses of the uninterrupted run (packed batches: the loader state includes the packing buffer)."""

import lightning as L
import pytest

from nemo_vfm.data.energon_datamodule import EnergonDataModule
from nemo_vfm.inference.generate import SamplingConfig
from nemo_vfm.lightning.data_stats import DataStatsCallback
from nemo_vfm.models.dit.model import DiTConfig
from nemo_vfm.train import ExperimentConfig, TrainerConfig, train


class Recorder(L.Callback):
    def __init__(self):
        self.keys, self.losses = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.keys.append(tuple(batch.keys))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))


def _run(prepared, root, name, max_steps):
    rec = Recorder()
    data = EnergonDataModule(str(prepared), micro_batch_size=1, max_seq_length=1024, pad_to_multiple=8,
                             packing_buffer_size=6, shuffle_buffer_size=6, seed=3)
    train(model=DiTConfig(num_layers=1, hidden_size=32, num_heads=2, in_channels=12, patch_size=(1, 2, 2),
                          context_dim=16),
          data=data,
          trainer=TrainerConfig(max_steps=max_steps, accelerator="cpu", devices=1, precision="32-true",
                                checkpoint_every_n_steps=3, log_every_n_steps=1, enable_progress_bar=False,
                                callbacks=[rec, DataStatsCallback()]),
          log=ExperimentConfig(name=name, root=str(root), tensorboard=False),
          sampling=SamplingConfig(enabled=False), ema_decay=None, seed=5)
    return rec


def test_interrupt_and_resume_same_samples_and_loss(prepared, tmp_path):
    full = _run(prepared, tmp_path, "full", 6)
    first = _run(prepared, tmp_path, "cut", 3)  # "crash" after the step-3 checkpoint
    resumed = _run(prepared, tmp_path, "cut", 6)  # a new process would do exactly this: same call, resumes
    assert len(full.keys) == 6 and len(resumed.keys) == 3
    assert first.keys + resumed.keys == full.keys
    assert first.losses + resumed.losses == pytest.approx(full.losses, rel=1e-6, abs=1e-7)
