"""A sharded checkpoint written by VFMParallelStrategy (CP2 training) generates under another layout (TP2)
exactly like one process that loads it."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
from gloo_launcher import run_distributed  # noqa: E402


def _train(rank, world, root):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    model = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=4, context_dim=16, adaln_lora_rank=4)
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16,
                                context_length=3, batch_size=2, num_samples=8)
    trainer = TrainerConfig(max_steps=2, devices=world, accelerator="cpu", precision="32-true",
                            strategy=VFMParallelStrategy(context_parallel_size=2, param_dtype=None),
                            log_every_n_steps=1, checkpoint_every_n_steps=2, enable_progress_bar=False)
    return train(model=model, data=data, trainer=trainer, log=ExperimentConfig(name="s", root=root, tensorboard=False),
                 ema_decay=0.9)["step"]


def _cond():
    g = torch.Generator().manual_seed(0)
    cond = {"context": torch.randn(1, 3, 16, generator=g), "context_mask": torch.ones(1, 3, dtype=torch.bool)}
    return cond, {"context": torch.zeros(1, 3, 16), "context_mask": torch.zeros(1, 3, dtype=torch.bool)}


def _generate_tp2(rank, world, exp):
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.distributed import InferenceLayout
    from nemo_vfm.inference.generate import SamplingConfig

    engine = InferenceEngine.from_checkpoint(exp, InferenceLayout(tp=2), device="cpu", dtype="fp32")
    assert engine.generation == {}  # mock latents: nothing to decode with, the network still samples
    return engine.denoise(*_cond(), (4, 2, 4, 4), SamplingConfig(num_steps=3, guidance=3.0, sampler="res"))


@pytest.mark.slow
def test_strategy_checkpoint_generates_under_tp2_like_one_process(tmp_path):
    from nemo_vfm.inference.checkpoint import load_checkpoint, read_checkpoint_info
    from nemo_vfm.inference.generate import SamplingConfig, generate_latents

    assert run_distributed(_train, 2, str(tmp_path))[0] == 2
    exp = tmp_path / "s"
    info = read_checkpoint_info(exp)
    assert info.kind == "dcp" and info.step == 2 and (info.path / "meta.pt").exists()
    loaded = load_checkpoint(exp)
    ref = generate_latents(loaded.net, loaded.objective, (4, 2, 4, 4), *_cond(),
                           SamplingConfig(num_steps=3, guidance=3.0, sampler="res"))
    got = run_distributed(_generate_tp2, 2, str(exp))
    for r in range(2):
        assert (got[r] - ref).abs().max() <= 1e-5 * ref.abs().max()
