"""Families are declared: every spec's knobs are ParallelConfig fields (one name per knob, from the strategy through
the spec to parallelize), an unknown or unread knob passed to parallelize fails naming it, an unknown config class
names the families there are, and a tensor-parallel plan entry that matches no module fails naming it."""

import dataclasses
import inspect

import pytest
import torch

from nemo_vfm.models.dit.flavors import dit_config
from nemo_vfm.models.families import _table, family_spec
from nemo_vfm.models.spec import FamilySpec
from nemo_vfm.parallel.config import PARALLELIZE_KNOBS, ParallelConfig
from nemo_vfm.parallel.parallelize import _apply
from nemo_vfm.parallel.tensor_parallel import check_tp_plan


def test_every_declared_knob_is_a_keyword_of_the_family_functions():
    fields = {f.name for f in dataclasses.fields(ParallelConfig)}
    for spec in _table():
        assert spec.knobs <= fields, spec.name  # the ParallelConfig field names, not a renamed keyword
        assert spec.knobs <= set(PARALLELIZE_KNOBS), spec.name
        assert spec.layout_knobs <= inspect.signature(spec.check_layout).parameters.keys(), spec.name
        assert spec.tp_optional <= spec.tp_plan.keys(), spec.name


def test_parallelize_takes_the_strategy_knobs_by_their_config_field_names():
    params = inspect.signature(_apply).parameters.keys() - {"model", "pmesh", "spec", "blocks_only"}
    assert params == set(PARALLELIZE_KNOBS)
    assert ParallelConfig().family_knobs.keys() == set(PARALLELIZE_KNOBS)
    assert {"activation_checkpointing_every", "fsdp_reshard_after_forward", "factorized_context_parallel",
            "factorized_context_parallel_chunks"} <= set(PARALLELIZE_KNOBS)


def test_a_family_declaring_a_knob_that_is_no_config_field_fails():
    spec = family_spec(dit_config("tiny"))
    with pytest.raises(ValueError, match=r"declares knobs \['ac_every'\] that are no parallelize knobs"):
        dataclasses.replace(spec, knobs=spec.knobs | {"ac_every"})
    assert isinstance(dataclasses.replace(spec), FamilySpec)


def test_a_direct_parallelize_call_with_an_unknown_or_unread_knob_fails_naming_it():
    from types import SimpleNamespace

    from nemo_vfm.models.stdit.flavors import stdit_config
    from nemo_vfm.parallel.dims import ParallelDims

    pmesh = SimpleNamespace(dims=ParallelDims(world_size=1))  # one process: nothing to split, no group needed
    net = dit_config("tiny").build("meta")
    spec = family_spec(net)
    with pytest.raises(ValueError, match=r"unknown parallelize knob some_unknown_knob; valid knobs .*"
                                         r"activation_checkpointing_every"):
        spec.parallelize(net, pmesh, some_unknown_knob=1)
    with pytest.raises(ValueError, match=r"unknown parallelize knob ac_every"):  # the old keyword name
        spec.parallelize(net, pmesh, ac_every=1)
    with pytest.raises(ValueError, match=r"dit family does not read factorized_context_parallel='ring'"):
        spec.parallelize(net, pmesh, factorized_context_parallel="ring")
    stdit = stdit_config("tiny").build("meta")
    with pytest.raises(ValueError, match=r"stdit family does not read fuse_qkv=True"):
        family_spec(stdit).parallelize(stdit, pmesh, fuse_qkv=True)
    assert spec.parallelize(net, pmesh, activation_checkpointing_every=1, param_dtype=None) is net


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


def test_every_token_split_names_arguments_its_block_takes():
    from nemo_vfm.models.ltx2.flavors import ltx2_config
    from nemo_vfm.models.moviegen.flavors import moviegen_config
    from nemo_vfm.models.stdit.flavors import stdit_config
    from nemo_vfm.models.wan.flavors import wan_config

    for cfg in (dit_config("tiny"), stdit_config("tiny"), moviegen_config("tiny"), wan_config("tiny"),
                ltx2_config("tiny")):
        block = cfg.build("meta").blocks[0]
        params = inspect.signature(block.forward).parameters
        assert set(family_spec(cfg).token_split.names()) <= params.keys(), type(block).__name__


def test_a_renamed_block_argument_fails_the_token_split():
    """Installing the split on a block whose token argument was renamed raises naming it (it used to stop being
    split without a word)."""
    from types import SimpleNamespace

    from nemo_vfm.models.dit import family as P
    from nemo_vfm.parallel.token_split import install_token_hooks

    class Renamed(torch.nn.Module):
        def forward(self, x, c, rope=None, context=None, context_mask=None, shared_adaln=None, attn_mask=None,
                    seg_ids=None):
            return x

    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([Renamed()])
    with pytest.raises(ValueError, match=r"names block argument\(s\) \['x_BSD'\], which Renamed.forward does not take"):
        install_token_hooks(model, SimpleNamespace(plan=P.TOKEN_SPLIT))
