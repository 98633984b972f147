"""Families are declared: every spec's knobs are keywords its parallelize function takes, an unknown config class
names the families there are, and a tensor-parallel plan entry that matches no module fails naming it."""

import inspect

import pytest

from nemo_vfm.models.dit.flavors import dit_config
from nemo_vfm.models.families import _table, family_spec
from nemo_vfm.parallel.tensor_parallel import check_tp_plan


def test_every_declared_knob_is_a_keyword_of_the_family_functions():
    for spec in _table():
        assert spec.knobs <= inspect.signature(spec.parallelize).parameters.keys(), spec.name
        assert spec.layout_knobs <= inspect.signature(spec.check_layout).parameters.keys(), spec.name
        assert spec.tp_optional <= spec.tp_plan.keys(), spec.name


def test_a_network_finds_its_spec_through_its_config():
    net = dit_config("tiny").build("meta")
    assert family_spec(net).name == "dit"
    with pytest.raises(NotImplementedError, match=r"belongs to no declared model family \(dit \(DiTConfig\)"):
        family_spec(object(), "use it in one process")


def test_a_renamed_layer_fails_the_tp_plan_instead_of_losing_tensor_parallelism():
    spec = family_spec(dit_config("tiny"))
    blocks = dit_config("tiny", context_dim=None).build("meta").blocks
    renamed = {**{k: v for k, v in spec.tp_plan.items() if k != "attn.proj"}, "attn.out": "rowwise"}
    with pytest.raises(ValueError, match=r"names \['attn.out'\] but block 0 \(DiTBlock\) has no such module"):
        check_tp_plan(blocks, renamed, optional=spec.tp_optional)  # apply_tensor_parallel checks first
    check_tp_plan(blocks, spec.tp_plan, optional=spec.tp_optional)  # cross-attention, the other MLP: optional
