"""Packing statistics in the training logs."""

from __future__ import annotations

from nemo_vfm.data.batch import PackedBatch
from nemo_vfm.data.energon_datamodule import EnergonDataModule
from nemo_vfm.lightning.callbacks import StepEndCallback


class DataStatsCallback(StepEndCallback):
    """Logs ``data/packing_efficiency`` (running) and ``data/segments`` at log steps when batches are packed (once
    per optimizer step: with ``accumulate_grad_batches > 1`` at the micro-batch that ends it)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self.step_ended(trainer) or trainer.global_step % max(1, trainer.log_every_n_steps):
            return  # Python floats become device tensors: a sync, so at log steps only
        if isinstance(batch, PackedBatch):
            dm = trainer.datamodule
            eff = dm.packing_efficiency if isinstance(dm, EnergonDataModule) else batch.efficiency
            pl_module.log("data/packing_efficiency", eff, prog_bar=False, batch_size=1)
            pl_module.log("data/segments", float(batch.num_segments), batch_size=1)
