"""Every registered recipe factory builds its config tree and serializes (nemo-run's YAML)."""

import fiddle as fdl
import nemo_run as run
import pytest

import nemo_vfm_recipes.dit as dit
from nemo_vfm.train import train

FACTORIES = ["pretrain", "pretrain_s", "pretrain_b", "pretrain_l", "pretrain_xl", "pretrain_7b", "pretrain_14b",
             "pretrain_28b", "pretrain_xl2_256", "quickstart"]


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
    assert xl.objective == base.objective
    assert base.trainer.strategy.fsdp and not xl.trainer.strategy.fsdp  # DiT-XL fits one GPU: plain data parallel
    xl.trainer.strategy.fsdp = True
    assert xl.trainer == base.trainer
    assert dit.pretrain_7b().model.adaln_lora_rank == 256


def test_flow_matching_switch():
    from nemo_vfm.diffusion.flow_matching import FlowMatching

    recipe = dit.with_flow_matching(dit.quickstart(), shift=3.0)
    assert fdl.build(recipe.objective) == FlowMatching(shift=3.0) and recipe.sampling.sampler == "euler"


def _walk(cfg, seen):
    if isinstance(cfg, fdl.Buildable):
        seen.add(cfg.__fn_or_cls__)
        for v in cfg.__arguments__.values():
            _walk(v, seen)
    elif isinstance(cfg, (list, tuple)):
        for v in cfg:
            _walk(v, seen)
    elif isinstance(cfg, dict):
        for v in cfg.values():
            _walk(v, seen)


def test_everything_a_recipe_configures_has_real_annotations():
    """nemo-run's CLI parses ``a.b=value`` from the annotations: a module with postponed annotations
    (``from __future__ import annotations``) makes every override of its configs fail to parse."""
    import importlib
    import inspect
    import pkgutil

    import nemo_vfm_recipes

    seen: set = set()
    for info in pkgutil.iter_modules(nemo_vfm_recipes.__path__):
        mod = importlib.import_module(f"nemo_vfm_recipes.{info.name}")
        for obj in vars(mod).values():
            if inspect.isfunction(obj) and obj.__module__ == mod.__name__:
                params = inspect.signature(obj).parameters.values()
                if all(p.default is not inspect.Parameter.empty for p in params):
                    result = obj()
                    if isinstance(result, fdl.Buildable):
                        _walk(result, seen)
    assert len(seen) > 5
    bad = [f"{t.__module__}.{t.__qualname__}" for t in seen
           if any(isinstance(p.annotation, str) for p in inspect.signature(t).parameters.values())]
    assert not bad, f"string annotations (remove `from __future__ import annotations`): {bad}"
