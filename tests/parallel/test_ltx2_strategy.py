"""LTX-2 through ``train()`` and VFMParallelStrategy on 2 gloo processes (CP2 with the audio stream replicated, TP2)
on mock audio + video batches: two steps, the same losses as one process (the second step checks the update)."""

import pytest
from gloo_launcher import run_distributed


def _train(rank, world, root, strategy_kw):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.diffusion.audio_video import AudioVideoFlowMatching
    from nemo_vfm.lightning.callbacks import read_metrics
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.models.ltx2.flavors import ltx2_config
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    data = MockLatentDataModule(latent_channels=8, num_frames=3, height=3, width=1, context_dim=16, context_length=3,
                                batch_size=2, num_samples=8, audio_shape=(2, 5, 4))
    strategy = VFMParallelStrategy(**strategy_kw) if strategy_kw else "auto"
    trainer = TrainerConfig(max_steps=2, devices=world, accelerator="cpu", precision="32-true", strategy=strategy,
                            log_every_n_steps=1, checkpoint_every_n_steps=5, enable_progress_bar=False,
                            gradient_clip_val=None)
    train(model=ltx2_config("tiny"), data=data, trainer=trainer, ema_decay=None,
          objective=AudioVideoFlowMatching(audio_weight=0.5), optim=OptimConfig(lr=1e-3, warmup_steps=0),
          log=ExperimentConfig(name="ltx2", root=root, tensorboard=False))
    if rank:  # rank 0 writes the metrics
        return None
    from pathlib import Path

    return [m["loss"] for m in read_metrics(Path(root) / "ltx2" / "metrics.jsonl") if "loss" in m]


@pytest.mark.slow
@pytest.mark.parametrize("kw", [dict(context_parallel_size=2, fsdp=False, param_dtype=None),
                                dict(tensor_model_parallel_size=2, fsdp=False, param_dtype=None)], ids=["cp2", "tp2"])
def test_ltx2_trains_like_one_process(tmp_path, kw):
    single = _train(0, 1, str(tmp_path / "single"), None)
    parallel = run_distributed(_train, 2, str(tmp_path / "parallel"), kw)
    assert len(single) == 2
    assert parallel[0] == pytest.approx(single, rel=1e-5)
