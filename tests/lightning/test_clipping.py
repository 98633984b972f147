"""Gradient clipping with a fused AdamW under bf16-mixed: Lightning's AMP plugin refuses it (it assumes an
fp16 scaler), our training step clips (``nemo_vfm.lightning.train_step``): the fused kernel divides the gradients by
its ``grad_scale``, so the gradients the optimizer steps with have the clipped norm."""

import lightning as L
import pytest
import torch

from nemo_vfm.data.synthetic import MockLatentDataModule
from nemo_vfm.diffusion.edm import EDM
from nemo_vfm.lightning.module import DiffusionModule, OptimConfig
from nemo_vfm.models.dit.model import DiTConfig


class _Probe(DiffusionModule):
    """Records the gradient norm the optimizer steps with (after Lightning's closure, where clipping runs; a fused
    AdamW divides the gradients by ``grad_scale`` inside its kernel)."""

    def configure_optimizers(self):
        out = super().configure_optimizers()
        opt, step = out["optimizer"], out["optimizer"].step
        self.norms = []

        def probed(closure=None, **kwargs):
            def wrapped():
                result = closure()
                grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
                scale = float(getattr(opt, "grad_scale", None) or 1.0)
                self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) / scale)
                return result

            return step(closure=wrapped, **kwargs)

        opt.step = probed
        return out


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_fused_adamw_clips_to_gradient_clip_val(precision):
    torch.manual_seed(0)
    cfg = DiTConfig(num_layers=2, hidden_size=32, num_heads=2, in_channels=4, context_dim=None)
    module = _Probe(cfg, EDM(), OptimConfig(fused=True, warmup_steps=0))
    trainer = L.Trainer(max_steps=3, accelerator="cpu", precision=precision, gradient_clip_val=1e-3, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=MockLatentDataModule(latent_channels=4, context_dim=None))
    assert trainer.global_step == 3 and len(module.norms) == 3
    assert all(n <= 1e-3 * 1.001 for n in module.norms), module.norms
    assert max(module.norms) > 0.9e-3  # clipped to the threshold, not zeroed


def test_strategy_fused_clipping_equals_clipping_the_gradients():
    """Under VFMParallelStrategy the fused AdamW clips through its ``grad_scale`` (no pass of its own over the
    gradients); the weights after a few clipped steps equal those of the unfused AdamW whose gradients were
    scaled in place."""
    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    def fit(fused: bool):
        torch.manual_seed(0)
        cfg = DiTConfig(num_layers=2, hidden_size=32, num_heads=2, in_channels=4, context_dim=None)
        module = DiffusionModule(cfg, EDM(), OptimConfig(fused=fused, warmup_steps=0, lr=1e-2), ema_decay=None)
        trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, precision="32-true", gradient_clip_val=1e-3,
                            strategy=VFMParallelStrategy(compile=False), logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False)
        trainer.fit(module, datamodule=MockLatentDataModule(latent_channels=4, context_dim=None))
        return module, trainer

    fused, trainer = fit(True)
    plain, _ = fit(False)
    opt = trainer.optimizers[0]
    assert opt.defaults["fused"] and float(opt.grad_scale) > 1  # the clip went through the kernel's grad_scale
    for a, b in zip(fused.model.parameters(), plain.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
