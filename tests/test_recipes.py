"""Every registered recipe factory builds its config tree and serializes (nemo-run's YAML)."""

import fiddle as fdl
import nemo_run as run
import pytest

import nemo_vfm_recipes.dit as dit
from nemo_vfm.train import train

FACTORIES = ["pretrain", "pretrain_s", "pretrain_b", "pretrain_l", "pretrain_xl", "pretrain_7b", "pretrain_14b",
             "pretrain_28b", "quickstart"]


@pytest.mark.parametrize("name", FACTORIES)
def test_recipe_builds_and_serializes(name):
    recipe = getattr(dit, name)()
    assert isinstance(recipe, run.Partial) and recipe.__fn_or_cls__ is train
    doc = getattr(dit, name).__doc__
    assert "CLI" in doc and "Python" in doc
    model = fdl.build(recipe.model)
    model.build("meta")  # every flavor constructs (without allocating)
    from nemo_run.core.serialization.yaml import YamlSerializer

    text = YamlSerializer().serialize(recipe)
    assert "model:" in text and "trainer:" in text


def test_variants_mutate_the_base():
    base, xl = dit.pretrain(), dit.pretrain_xl()
    assert xl.objective == base.objective and xl.trainer == base.trainer
    assert dit.pretrain_7b().model.adaln_lora_rank == 256


def test_flow_matching_switch():
    from nemo_vfm.diffusion.flow_matching import FlowMatching

    recipe = dit.with_flow_matching(dit.quickstart(), shift=3.0)
    assert fdl.build(recipe.objective) == FlowMatching(shift=3.0) and recipe.sampling.sampler == "euler"
