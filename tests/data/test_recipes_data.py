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
