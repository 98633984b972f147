"""``OptimConfig(name="adamw8bit")``: torchao's 8-bit AdamW (both moments as 8-bit codes with block scales) in place
of torch's AdamW. It runs on the CPU (torchao compiles its per-parameter update with inductor's C++ backend), so
these tests step it for real: it learns like fp32 AdamW, goes through the module's clipping and non-finite
handling (it has no fused kernel: gradients are scaled, or cleared for a dropped update), and its options fail
clearly."""

import importlib.util
import sys

import lightning as L
import pytest
import torch

from nemo_vfm.data.synthetic import MockLatentDataModule
from nemo_vfm.diffusion.edm import EDM
from nemo_vfm.lightning.module import DiffusionModule, OptimConfig, build_optimizer
from nemo_vfm.models.dit.model import DiTConfig

pytest.importorskip("torchao")  # the fp8 extra; the error without it is tested below with torchao hidden


def _regression(name: str, steps: int = 6) -> tuple[list[float], torch.Tensor, torch.optim.Optimizer]:
    """A bias-free 32 -> 192 linear (6144 weights: 8-bit state; the shape of the tiny DiT's adaLN projection below,
    so that torchao's compiled update is compiled once for both tests) fitted to a fixed target."""
    torch.manual_seed(0)
    net = torch.nn.Linear(32, 192, bias=False)
    x, target = torch.randn(64, 32), torch.randn(64, 32) @ torch.randn(32, 192) * 0.1
    opt = build_optimizer(OptimConfig(name=name, lr=1e-2, warmup_steps=0), [{"params": [net.weight]}])
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(net(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, net.weight.detach().clone(), opt


def test_adamw8bit_learns_like_fp32_adamw():
    from torchao.optim import AdamW8bit
    from torchao.optim.subclass_8bit import OptimState8bit

    losses8, w8, opt = _regression("adamw8bit")
    losses32, w32, _ = _regression("adamw")
    assert isinstance(opt, AdamW8bit)
    assert isinstance(opt.state[opt.param_groups[0]["params"][0]]["exp_avg"], OptimState8bit)  # really 8-bit
    assert losses8[-1] < 0.8 * losses8[0]  # it learns
    torch.testing.assert_close(torch.tensor(losses8), torch.tensor(losses32), rtol=1e-2, atol=0)
    torch.manual_seed(0)
    w0 = torch.nn.Linear(32, 192, bias=False).weight.detach()
    moved = (w32 - w0).norm()
    assert (w8 - w32).norm() < 0.05 * moved, float((w8 - w32).norm() / moved)  # within 5% of fp32 AdamW's update


class _PoisonStep(L.Callback):
    """Makes one gradient NaN after the backward of step 2 (the loss stays finite); records the weights around it."""

    def on_after_backward(self, trainer, pl_module):
        if trainer.global_step == 1:
            next(p for p in pl_module.model.parameters() if p.grad is not None).grad.view(-1)[0] = float("nan")
            self.before = [p.detach().clone() for p in pl_module.model.parameters()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            self.after = [p.detach().clone() for p in pl_module.model.parameters()]
            self.grads = [p.grad for p in pl_module.model.parameters()]
            self.bad = bool(pl_module.last_update_bad)


def test_adamw8bit_dropped_update_leaves_weights_unchanged():
    """A NaN gradient: the training step (no fused kernel to take ``found_inf``) clears the gradients, and the
    8-bit AdamW skips parameters without one."""
    torch.manual_seed(0)
    cfg = DiTConfig(num_layers=1, hidden_size=32, num_heads=2, in_channels=4, context_dim=None)
    module = DiffusionModule(cfg, EDM(), OptimConfig(name="adamw8bit", warmup_steps=0, lr=1e-3), ema_decay=None)
    poison = _PoisonStep()
    trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, precision="32-true", gradient_clip_val=1.0,
                        callbacks=[poison], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, datamodule=MockLatentDataModule(latent_channels=4, num_frames=2, height=8, width=8,
                                                        context_dim=None, batch_size=2, num_samples=8))
    assert poison.bad and all(g is None for g in poison.grads)
    assert all(torch.equal(a, b) for a, b in zip(poison.before, poison.after))


class _Probe(DiffusionModule):
    """Records the gradient norm each optimizer step sees (after clipping)."""

    def configure_optimizers(self):
        out = super().configure_optimizers()
        opt, step = out["optimizer"], out["optimizer"].step
        self.norms = []

        def probed(closure=None, **kwargs):
            def wrapped():
                result = closure()
                grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
                self.norms.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
                return result

            return step(closure=wrapped, **kwargs)

        opt.step = probed
        return out


def test_module_trains_with_adamw8bit_and_clips_under_the_strategy():
    """The module's path (VFMParallelStrategy, whose clipping uses the mesh-wide norm): AdamW8bit is built,
    ``fused=None`` stays unfused on any device, the gradients it steps with are clipped, and the logged learning
    rate is a copy (the optimizer keeps the rate in a tensor the scheduler fills in place)."""
    from torchao.optim import AdamW8bit

    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    torch.manual_seed(0)
    cfg = DiTConfig(num_layers=1, hidden_size=32, num_heads=2, in_channels=4, context_dim=None)
    module = _Probe(cfg, EDM(), OptimConfig(name="adamw8bit", warmup_steps=2, lr=1e-3), ema_decay=None)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, precision="32-true", gradient_clip_val=1e-3,
                        strategy=VFMParallelStrategy(compile=False), logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False)
    before = {n: p.detach().clone() for n, p in cfg.build().named_parameters()}
    trainer.fit(module, datamodule=MockLatentDataModule(latent_channels=4, num_frames=2, height=8, width=8,
                                                        context_dim=None, batch_size=2, num_samples=8))
    opt = trainer.optimizers[0]
    assert isinstance(opt, AdamW8bit) and not opt.defaults.get("fused")
    assert trainer.global_step == 3 and len(module.norms) == 3
    assert all(n <= 1e-3 * 1.001 for n in module.norms) and max(module.norms) > 0.9e-3, module.norms
    logged = module.step_metrics["lr"]
    assert float(logged) == pytest.approx(1e-3) and logged.data_ptr() != opt.param_groups[0]["lr"].data_ptr()
    changed = [n for n, p in module.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed  # the 8-bit AdamW updated the weights


def test_optim_name_errors():
    with pytest.raises(ValueError, match="OptimConfig.name must be one of"):
        OptimConfig(name="sgd")
    with pytest.raises(ValueError, match="fused=True"):
        OptimConfig(name="adamw8bit", fused=True)
    assert OptimConfig(name="adamw8bit", fused=False).name == "adamw8bit"


def test_adamw8bit_without_torchao_names_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install 'nemo-vfm\[fp8\]'"):
        OptimConfig(name="adamw8bit")
    monkeypatch.undo()
    cfg = OptimConfig(name="adamw8bit")
    monkeypatch.setitem(sys.modules, "torchao.optim", None)  # an import of it fails
    with pytest.raises(ImportError, match=r"pip install 'nemo-vfm\[fp8\]'"):
        build_optimizer(cfg, [{"params": [torch.nn.Parameter(torch.zeros(4))]}])


def test_train_with_adamw8bit_checkpoints_and_resumes(tmp_path):
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    cfg = DiTConfig(num_layers=1, hidden_size=32, num_heads=2, in_channels=4, context_dim=None)
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=8, width=8, context_dim=None, batch_size=2,
                                num_samples=8)
    for steps in (1, 2):  # the second call resumes the first one's checkpoint, 8-bit optimizer state included
        out = train(model=cfg, data=data, optim=OptimConfig(name="adamw8bit", warmup_steps=0), ema_decay=None,
                    trainer=TrainerConfig(max_steps=steps, accelerator="cpu", devices=1, precision="32-true",
                                          enable_progress_bar=False),
                    log=ExperimentConfig(name="r", root=str(tmp_path), tensorboard=False),
                    sampling=SamplingConfig(enabled=False))
        assert out["step"] == steps

