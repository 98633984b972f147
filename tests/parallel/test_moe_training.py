"""MoE models through ``train()``: the load-balancing loss reaches the training loss, router statistics reach the
step log and TensorBoard at logging steps, and under the strategy with expert_model_parallel_size=2 (2 gloo
processes) a run writes sharded checkpoints that resume without EP."""

import json
import logging
from pathlib import Path

import pytest
from gloo_launcher import run_distributed


def _train(root, max_steps, strategy=None, devices=1):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.models.common.moe import MoEConfig
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    moe = MoEConfig(num_experts=4, expert_ffn_size=32, routing="top_k", top_k=2, aux_loss_coef=0.1, gemm="loop")
    model = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=4, context_dim=16, moe=moe)
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16,
                                context_length=3, batch_size=2, num_samples=8)
    trainer = TrainerConfig(max_steps=max_steps, devices=devices, accelerator="cpu", precision="32-true",
                            strategy=strategy or "auto", log_every_n_steps=2, checkpoint_every_n_steps=2,
                            enable_progress_bar=False)
    return train(model=model, data=data, trainer=trainer, log=ExperimentConfig(name="moe", root=root), ema_decay=0.9)


def _metrics(root) -> list[dict]:
    return [json.loads(line) for line in (Path(root) / "moe" / "metrics.jsonl").read_text().splitlines()]


def _tb_has(root, tag: str) -> bool:
    return any(tag.encode() in p.read_bytes() for p in (Path(root) / "moe" / "tb").rglob("events.*"))


def test_aux_loss_and_router_stats_reach_the_logs(tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        out = _train(str(tmp_path), 2)
    assert out["step"] == 2
    rows = _metrics(tmp_path)
    assert all(r["moe_aux_loss"] > 0 for r in rows)
    assert _tb_has(tmp_path, "moe/max_load") and _tb_has(tmp_path, "moe/tokens_expert_3")
    assert any("moe load max/min" in m and "tokens/expert [" in m for m in caplog.messages)


def _train_ep(rank, world, root, max_steps, ep):
    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    return _train(root, max_steps, VFMParallelStrategy(expert_model_parallel_size=ep, param_dtype=None), world)


@pytest.mark.slow
def test_ep2_training_checkpoints_and_resumes_without_ep(tmp_path):
    first = run_distributed(_train_ep, 2, str(tmp_path), 2, 2)[0]
    assert first["step"] == 2 and first["loss"] is not None
    ckpt = tmp_path / "moe" / "checkpoints"
    assert any((p / ".metadata").exists() for p in ckpt.iterdir() if p.is_dir())
    second = run_distributed(_train_ep, 2, str(tmp_path), 3, 1)[0]
    assert second["step"] == 3
