"""The Cosmos-Predict2.5 recipes: registered with the launcher, dry-run through the CLI, and each one, shrunk to CPU
size (a tiny random Cosmos folder as its weights, mock latents with conditioning frames drawn by the objective),
trains 2 steps and resumes as ``tests/test_recipes_resume.py`` does for the other families."""

import sys
from pathlib import Path

import catalogue
import fiddle as fdl
import pytest
import torch
from nemo_run.config import get_type_namespace

from nemo_vfm.data.synthetic import MockLatentDataModule
from nemo_vfm.lightning.callbacks import read_metrics
from nemo_vfm.train import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "launchers"))

import train as launcher  # noqa: E402  (launchers/train.py)

launcher.register_recipes()
COSMOS = ("lora_cosmos_predict2_5_2b", "finetune_cosmos_predict2_5_2b", "finetune_cosmos_predict2_5_14b")
ONE_PROCESS = dict(tensor_model_parallel_size=1, context_parallel_size=1, pipeline_model_parallel_size=1,
                   expert_model_parallel_size=1, data_parallel_replicate_size=1, sequence_parallel=False)


@pytest.fixture(scope="module")
def cosmos_folder(tmp_path_factory):
    from nemo_vfm.models.cosmos import convert
    from nemo_vfm.models.cosmos.flavors import cosmos_config

    cfg = cosmos_config("tiny")
    out = tmp_path_factory.mktemp("cosmos")
    torch.manual_seed(0)
    convert.save_weights(cfg.build().state_dict(), out, cfg)
    return out


def _shrink(name: str, root: Path, folder: Path) -> fdl.Config:
    from nemo_vfm.models.cosmos.convert import read_config

    recipe = catalogue._get((get_type_namespace(train), name))()
    recipe.model = fdl.Config(recipe.model.__fn_or_cls__, **vars(read_config(folder, pretrained=str(folder))))
    model = fdl.build(recipe.model)
    recipe.data = fdl.Config(MockLatentDataModule, latent_channels=model.in_channels, num_frames=3, height=4, width=4,
                             context_dim=model.context_dim, context_length=4, batch_size=2, num_samples=8)
    for k, v in ONE_PROCESS.items():
        setattr(recipe.trainer.strategy, k, v)
    recipe.trainer.strategy.microbatches = None
    t = recipe.trainer
    t.accelerator, t.devices, t.num_nodes = "cpu", 1, 1
    t.max_steps, t.checkpoint_every_n_steps, t.log_every_n_steps, t.enable_progress_bar = 2, 2, 1, False
    recipe.sampling.num_samples, recipe.sampling.num_steps = 1, 2
    recipe.log.root, recipe.log.name, recipe.log.tensorboard = str(root), name, False
    return recipe


def test_the_recipes_are_registered_and_declare_the_release_objective():
    from nemo_vfm.diffusion.conditioning_frames import ConditioningFramesFlowMatching
    from nemo_vfm.models.cosmos.model import CosmosConfig

    registered = {key[-1] for key in catalogue._get_all([get_type_namespace(train)])}
    assert set(COSMOS) <= registered
    for name in COSMOS:
        recipe = catalogue._get((get_type_namespace(train), name))()
        assert recipe.model.__fn_or_cls__ is CosmosConfig and recipe.model.pretrained.startswith("checkpoints/")
        obj = fdl.build(recipe.objective)
        assert isinstance(obj, ConditioningFramesFlowMatching) and obj.shift == 5.0 and obj.frame_probs == (0.5, 0.25, 0.25)
    lora = catalogue._get((get_type_namespace(train), "lora_cosmos_predict2_5_2b"))()
    assert lora.lora.rank == 32 and "mlp.layer2" in lora.lora.targets
    big = catalogue._get((get_type_namespace(train), "finetune_cosmos_predict2_5_14b"))()
    assert big.model.num_layers == 36 and big.trainer.strategy.context_parallel_size == 2
    assert big.trainer.strategy.context_parallel_kind == "a2a"


def test_cli_dry_run(capsys):
    """``launchers/train.py --factory lora_cosmos_predict2_5_2b --dryrun`` (in process: the launcher's main)."""
    assert launcher.main(["--factory", "lora_cosmos_predict2_5_2b", "--dryrun", "lora.rank=8"]) == 0
    out = capsys.readouterr()
    assert "CosmosConfig" in out.out + out.err


@pytest.mark.parametrize("name", COSMOS)
def test_recipe_trains_two_steps_and_resumes(name, tmp_path, cosmos_folder, capsys):
    first = fdl.build(_shrink(name, tmp_path, cosmos_folder))()
    assert first["step"] == 2 and Path(first["checkpoint"]).exists(), first
    again = _shrink(name, tmp_path, cosmos_folder)
    again.trainer.max_steps = 3
    second = fdl.build(again)()
    assert "resuming from" in capsys.readouterr().out
    assert second["step"] == 3
    rows = [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["loss"] == r["loss"] for r in rows)
