"""Fine-tuning recipes: each builds, serializes, constructs its network on the meta device and dry-runs
through launchers/train.py; a missing pretrained path fails before anything is built."""

import subprocess
import sys
from pathlib import Path

import fiddle as fdl
import nemo_run as run
import pytest

import nemo_vfm_recipes.finetune as ft
from nemo_vfm.data.synthetic import MockLatentDataModule
from nemo_vfm.train import train

ROOT = Path(__file__).resolve().parents[1]
FACTORIES = ["finetune_wan_1_3b", "finetune_wan_14b", "lora_wan_1_3b", "lora_wan_14b", "dreambooth",
             "dreambooth_wan_1_3b"]


@pytest.mark.parametrize("name", FACTORIES)
def test_recipe_builds_and_serializes(name):
    from nemo_run.core.serialization.yaml import YamlSerializer

    recipe = getattr(ft, name)()
    assert isinstance(recipe, run.Partial) and recipe.__fn_or_cls__ is train
    doc = getattr(ft, name).__doc__
    assert "CLI" in doc and "Python" in doc
    model = fdl.build(recipe.model)
    net = model.build("meta")
    if name.startswith("lora") or "wan" in name:
        assert model.pretrained  # starts from the published weights
    else:
        assert recipe.init_from
    lora = fdl.build(recipe.lora) if recipe.__arguments__.get("lora") is not None else None
    if lora is not None:
        from nemo_vfm.models.common.lora import apply_lora

        adapted = apply_lora(net, lora)
        assert len(adapted) == 10 * len(net.blocks)  # attention (self + cross: q k v o) and the 2 MLP linears
        assert recipe.ema_decay is None
    assert "model:" in YamlSerializer().serialize(recipe)


def test_layouts():
    s14 = ft.finetune_wan_14b().trainer.strategy
    assert s14.fsdp and s14.context_parallel_size == 2 and s14.activation_checkpointing == "save_attention"
    assert s14.context_parallel_kind == "a2a"  # faster than ring at 480p on 4 H100s (docs/benchmarks.md)
    assert ft.lora_wan_14b().lora.frozen_dtype == "bf16"
    r = ft.with_lora(ft.dreambooth(), rank=4)
    assert r.lora.rank == 4 and r.lora.alpha == 4.0 and r.lora.targets is None


def _launch(*args):
    return subprocess.run([sys.executable, str(ROOT / "launchers" / "train.py"), *args], capture_output=True,
                          text=True, timeout=300)


def test_dryrun_lora_wan_14b_with_overrides():
    r = _launch("--factory", "lora_wan_14b", "--yes", "--dryrun", "lora.rank=8", "model.pretrained=/w/Wan14B")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rank=8" in r.stdout and "/w/Wan14B" in r.stdout and "Dry run" in r.stdout


def test_missing_pretrained_fails_before_building(tmp_path):
    recipe = ft.lora_wan_1_3b()
    recipe.model.pretrained = str(tmp_path / "nowhere")
    recipe.log.root = str(tmp_path)
    recipe.trainer.strategy = "auto"
    recipe.data = run.Config(MockLatentDataModule, latent_channels=16, context_dim=4096, context_length=8)
    with pytest.raises(FileNotFoundError, match="model.pretrained"):
        fdl.build(recipe)()
    recipe = ft.dreambooth()
    recipe.init_from = str(tmp_path / "nowhere")
    recipe.log.root = str(tmp_path)
    with pytest.raises(FileNotFoundError, match="init_from"):
        fdl.build(recipe)()
