"""The training step (``nemo_vfm.lightning.train_step.train_step``) under Lightning's manual optimization: it takes
``Trainer(accumulate_grad_batches=, gradient_clip_val=)`` as automatic optimization did (one optimizer and LR step per
N batches), clips the unscaled gradients under ``16-mixed``, and a checkpoint whose steps were counted by automatic
optimization resumes at its step."""

import lightning as L
import torch

from nemo_vfm.data.synthetic import MockLatentDataModule
from nemo_vfm.diffusion.edm import EDM
from nemo_vfm.lightning.module import DiffusionModule, OptimConfig
from nemo_vfm.models.dit.model import DiTConfig


def _module(**optim):
    torch.manual_seed(0)
    cfg = DiTConfig(num_layers=1, hidden_size=32, num_heads=2, in_channels=4, context_dim=None)
    return DiffusionModule(cfg, EDM(), OptimConfig(warmup_steps=0, **optim), ema_decay=0.9)


def _data():
    return MockLatentDataModule(latent_channels=4, num_frames=2, height=8, width=8, context_dim=None, batch_size=2,
                                num_samples=64)


class _Steps(L.Callback):
    """Records, per batch, the global step after it and whether the optimizer stepped."""

    def __init__(self):
        self.rows, self.stepped = [], 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.stepped += 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append((batch_idx, trainer.global_step, self.stepped))


def test_accumulation_steps_once_per_n_batches():
    module, steps = _module(), _Steps()
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, precision="32-true", accumulate_grad_batches=2,
                        gradient_clip_val=1.0, callbacks=[steps], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=_data())
    assert not module.automatic_optimization  # the step is train_step's
    assert steps.rows == [(0, 0, 0), (1, 1, 1), (2, 1, 1), (3, 2, 2), (4, 2, 2), (5, 3, 3)]
    opt, sched = trainer.optimizers[0], trainer.lr_scheduler_configs[0].scheduler
    assert sched.last_epoch == 3 and all(int(s["step"]) == 3 for s in opt.state.values())
    assert trainer.fit_loop.epoch_loop._batches_that_stepped == 3  # the loggers' step counts optimizer steps


def test_16_mixed_clips_the_unscaled_gradients():
    """Under fp16 loss scaling the gradients the step clips are still scaled: the optimizer (after the scaler has
    unscaled them) sees the clipped norm."""
    module, norms = _module(lr=1e-3), []

    class Probe(L.Callback):
        def on_train_start(self, trainer, pl_module):
            def pre(opt, args, kwargs):
                grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
                norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))

            trainer.optimizers[0].register_step_pre_hook(pre)

    from lightning.pytorch.plugins.precision import MixedPrecision

    fp16 = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))  # precision="16-mixed" is bf16 on CPU
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, plugins=[fp16], gradient_clip_val=1e-3,
                        callbacks=[Probe()], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, datamodule=_data())
    assert trainer.precision_plugin.scaler is not None and trainer.global_step == 3 and len(norms) == 3, norms
    assert all(n <= 1e-3 * 1.001 for n in norms) and max(norms) > 0.9e-3, norms


def test_checkpoint_counted_by_automatic_optimization_resumes_at_its_step():
    from nemo_vfm.lightning.resume import count_steps_as_manual

    def progress(n):
        return {"total": {"ready": n, "completed": n}, "current": {"ready": n, "completed": n}}

    old = {"loops": {"fit_loop": {
        "epoch_loop.automatic_optimization.optim_progress": {"optimizer": {"step": progress(4)}},
        "epoch_loop.manual_optimization.optim_step_progress": progress(0)}}}
    count_steps_as_manual(old)
    assert old["loops"]["fit_loop"]["epoch_loop.manual_optimization.optim_step_progress"] == progress(4)
    new = {"loops": {"fit_loop": {
        "epoch_loop.automatic_optimization.optim_progress": {"optimizer": {"step": progress(0)}},
        "epoch_loop.manual_optimization.optim_step_progress": progress(6)}}}
    count_steps_as_manual(new)
    assert new["loops"]["fit_loop"]["epoch_loop.manual_optimization.optim_step_progress"] == progress(6)


def test_resume_of_an_automatic_optimization_checkpoint_continues_at_its_step(tmp_path):
    """A checkpoint file written with the step counted under automatic optimization (as before ``train_step``)
    resumes at its step: the module copies the count (``count_steps_as_manual``)."""
    module = _module()
    trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, precision="32-true", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=_data())
    path = tmp_path / "step=2.ckpt"
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=False)
    loop = ckpt["loops"]["fit_loop"]
    manual = loop["epoch_loop.manual_optimization.optim_step_progress"]
    loop["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"] = {k: dict(v) for k, v in
                                                                                     manual.items()}
    loop["epoch_loop.manual_optimization.optim_step_progress"] = {k: {kk: 0 for kk in v} for k, v in manual.items()}
    torch.save(ckpt, path)
    batches = _Steps()
    resumed = L.Trainer(max_steps=4, accelerator="cpu", devices=1, precision="32-true", callbacks=[batches],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    resumed.fit(_module(), datamodule=_data(), ckpt_path=str(path), weights_only=False)
    assert resumed.global_step == 4 and [r[1] for r in batches.rows] == [3, 4]  # steps 3 and 4 only
