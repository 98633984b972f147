"""Data recipes build, serialize and plug into the pretrain recipes (no data is read while building)."""

import fiddle as fdl
import pytest

run = pytest.importorskip("nemo_run")


def test_energon_recipes_build_and_plug_in(prepared, prepared_b):
    from nemo_vfm.data.energon_datamodule import EnergonDataModule
    from nemo_vfm.data.prepare import PrepareConfig
    from nemo_vfm_recipes import data, dit

    recipe = dit.pretrain_s()
    recipe.data = data.packed(data.energon_datamodule(path=str(prepared), num_workers=0), max_seq_length=1024)
    cfg = fdl.build(recipe.data)
    assert isinstance(cfg, EnergonDataModule) and cfg.max_seq_length == 1024 and cfg.pad_to_multiple == 8
    blend = fdl.build(data.energon_blend([(str(prepared), 3.0), (str(prepared_b), 1.0)], num_workers=0))
    assert blend.path.endswith(".yaml") and blend.context_dim == 16
    from nemo_run.core.serialization.yaml import YamlSerializer

    assert "EnergonDataModule" in YamlSerializer().serialize(recipe.data)
    prep = data.prepare_recipe("in", "out", tokenizer_kwargs={"spatial_compression": 2})
    assert prep.cfg.__fn_or_cls__ is PrepareConfig and prep.cfg.samples_per_shard == 64


def test_mock_data_takes_the_models_shape_from_the_cli(tmp_path):
    """``data=mock`` on the CLI: random latents whose channels and text width are the model's (Wan 2.2 TI2V: 48
    channels), trained by the recipe through launchers/train.py."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(root / "launchers" / "train.py"), "--factory", "lora_wan2_2_ti2v_5b", "--yes",
           "model.pretrained=None", "data=mock", "data.num_frames=2", "data.height=4", "data.width=4",
           "data.context_length=8", "model.num_layers=1", "model.hidden_size=32", "model.num_heads=2",
           "model.ffn_size=32", "model.text_len=8", "model.context_dim=16", "model.freq_dim=32",
           "trainer.max_steps=2", "trainer.accelerator=cpu", "trainer.log_every_n_steps=1", f"log.root={tmp_path}"]
    # the recipe's defaults otherwise (compiled blocks, sampling on: mock data has no tokenizer, so no previews)
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / "lora_wan2_2_ti2v_5b" / "perf.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "MockLatentDataModule" in (tmp_path / "lora_wan2_2_ti2v_5b" / "config.yaml").read_text()


def test_mock_data_without_channels_needs_match_model():
    from nemo_vfm.data.synthetic import MockLatentDataModule

    with pytest.raises(ValueError, match="match_model=True"):
        MockLatentDataModule(latent_channels=None)
    d = MockLatentDataModule(latent_channels=None, context_dim=None, match_model=True)

    class M:
        in_channels, cond_channels, context_dim = 36, 20, 4096  # a Wan I2V: 16 noise channels

    d.take_model_shape(M())
    assert d.latent_shape[0] == 16 and d.context_dim == 4096
    kept = MockLatentDataModule(latent_channels=8, context_dim=None)
    kept.take_model_shape(M())
    assert kept.latent_shape[0] == 8 and kept.context_dim is None  # without match_model: None means no text
