"""Wan 2.2 recipes: each builds and serializes with its flavor, objective and expert; one expert per A14B run
(``with_expert``; both at once is refused); a dry run through launchers/train.py takes the expert overrides.
(Training two steps and resuming on CPU: tests/test_recipes_resume.py, which runs every registered factory.)"""

import subprocess
import sys
from pathlib import Path

import fiddle as fdl
import pytest

import nemo_vfm_recipes.finetune as ft
from nemo_vfm.diffusion.experts import ExpertFlowMatching
from nemo_vfm.diffusion.first_frame import FirstFrameFlowMatching

ROOT = Path(__file__).resolve().parents[1]
FACTORIES = {"lora_wan2_2_ti2v_5b": (48, None), "finetune_wan2_2_ti2v_5b": (48, None),
             "lora_wan2_2_t2v_a14b": (16, 0.875), "lora_wan2_2_i2v_a14b": (36, 0.9),
             "finetune_wan2_2_t2v_a14b": (16, 0.875)}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_wan22_recipe_builds(name):
    from nemo_run.core.serialization.yaml import YamlSerializer

    recipe = getattr(ft, name)()
    doc = getattr(ft, name).__doc__
    assert "CLI" in doc and "Python" in doc
    assert "docs/benchmarks.md" in doc or "not measured" in doc  # where its measured speed is, or that it is not
    in_channels, boundary = FACTORIES[name]
    model, objective = fdl.build(recipe.model), fdl.build(recipe.objective)
    assert model.in_channels == in_channels and model.pretrained.startswith("checkpoints/Wan2.2-")
    assert model.build("meta").num_params() > 4e9
    if boundary is None:
        assert isinstance(objective, FirstFrameFlowMatching) and model.expert is None and objective.image_prob == 0.5
        assert recipe.data.path == "data/wan2_2_prepared"
    else:
        assert isinstance(objective, ExpertFlowMatching) and objective.boundary == boundary
        assert model.expert == objective.expert == "high" and model.image_dim is None
    assert "model:" in YamlSerializer().serialize(recipe)


def test_with_expert_switches_weights_and_times_and_refuses_both():
    low = fdl.build(ft.with_expert(ft.lora_wan2_2_t2v_a14b(), "low").objective)
    assert low.expert == "low" and float(low.sample_time(1000).max()) < 0.875
    assert ft.with_expert(ft.finetune_wan2_2_t2v_a14b(), "low").model.expert == "low"
    with pytest.raises(NotImplementedError, match="once per expert"):
        ft.with_expert(ft.lora_wan2_2_t2v_a14b(), "both")
    recipe = ft.lora_wan2_2_t2v_a14b()
    recipe.model.expert = "both"
    with pytest.raises(NotImplementedError, match="one expert per run"):
        fdl.build(recipe.model)


def test_dryrun_with_expert_overrides():
    r = subprocess.run([sys.executable, str(ROOT / "launchers" / "train.py"), "--factory", "lora_wan2_2_t2v_a14b",
                        "--yes", "--dryrun", "model.expert=low", "objective.expert=low", "model.pretrained=/w/A14B"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "expert='low'" in r.stdout and "/w/A14B" in r.stdout and "Dry run" in r.stdout


def test_mismatched_expert_settings_fail_before_anything_is_built(tmp_path):
    """model.expert picks the weights, objective.expert the times: train() refuses a run where they differ."""
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.diffusion.flow_matching import FlowMatching
    from nemo_vfm.models.wan.flavors import wan_config
    from nemo_vfm.train import ExperimentConfig, train

    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16, context_length=4)
    log = ExperimentConfig(name="x", root=str(tmp_path))
    with pytest.raises(ValueError, match=r"model.expert='high'.*objective.expert='low'"):
        train(model=wan_config("tiny", expert="high"), data=data, objective=ExpertFlowMatching(expert="low"), log=log)
    with pytest.raises(ValueError, match=r"ExpertFlowMatching with expert='low'"):
        train(model=wan_config("tiny", expert="low"), data=data, objective=FlowMatching(), log=log)
    assert not (tmp_path / "x").exists()  # nothing written
