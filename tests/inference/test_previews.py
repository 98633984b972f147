"""Training previews need PyAV to write their mp4s: a run without it stops before its first step, naming the fix
(a GPU learning check once trained 4,800 steps and then failed on the missing module)."""

import importlib.util

import pytest


def test_missing_pyav_stops_the_run_before_training(tmp_path, monkeypatch):
    from nemo_vfm.data.synthetic import ShapesDataModule
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.models.dit.flavors import dit_config
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "av" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install av .* sampling.enabled=false"):
        train(model=dit_config("tiny", in_channels=12, context_dim=16, patch_size=(1, 2, 2)),
              data=ShapesDataModule(num_clips=8, num_frames=2, height=16, width=16, batch_size=4,
                                    tokenizer_kwargs={"spatial_compression": 2}, text_encoder_kwargs={"dim": 16}),
              trainer=TrainerConfig(max_steps=2, precision="32-true", accelerator="cpu", devices=1,
                                    enable_progress_bar=False, log_every_n_steps=1),
              log=ExperimentConfig(name="run", root=str(tmp_path)), sampling=SamplingConfig(every_n_steps=2))
    assert not (tmp_path / "run" / "perf.jsonl").exists()  # no step ran
