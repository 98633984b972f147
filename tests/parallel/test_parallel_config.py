"""The strategy's settings live in one documented dataclass (``nemo_vfm.parallel.config.ParallelConfig``): the
strategy's knobs are exactly its fields (same defaults), each field has a docstring, bad combinations fail when
the config is built, and the families receive the same knobs as before."""

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import fiddle as fdl
import pytest

from nemo_vfm.lightning.strategy import VFMParallelStrategy
from nemo_vfm.parallel.config import ParallelConfig

LIGHTNING_OWN = {"save_distributed_checkpoint", "process_group_backend", "timeout"}


def test_strategy_knobs_are_the_config_fields_with_the_same_defaults():
    params = {n: p.default for n, p in inspect.signature(VFMParallelStrategy.__init__).parameters.items()
              if n != "self" and n not in LIGHTNING_OWN}
    assert params == {f.name: f.default for f in dataclasses.fields(ParallelConfig)}


def test_the_strategy_takes_its_knobs_from_the_config_fields_not_a_second_list():
    source = inspect.getsource(VFMParallelStrategy.__init__)
    assert "tensor_model_parallel_size" not in source and "activation_checkpointing" not in source
    hints = typing.get_type_hints(ParallelConfig)
    params = inspect.signature(VFMParallelStrategy).parameters  # what Fiddle and NeMo-Run's CLI read
    assert all(params[f.name].annotation == hints[f.name] for f in dataclasses.fields(ParallelConfig))
    s = fdl.build(fdl.Config(VFMParallelStrategy, context_parallel_size=2, fsdp=False))
    assert s.config == ParallelConfig(context_parallel_size=2, fsdp=False)
    assert fdl.Config(VFMParallelStrategy).activation_checkpointing == "none"  # a default Fiddle reads


def test_an_unknown_strategy_knob_fails_naming_it_and_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown VFMParallelStrategy knob tensor_parallel; valid knobs: "
                                         r"tensor_model_parallel_size, .*cpu_offload, save_distributed_checkpoint"):
        VFMParallelStrategy(tensor_parallel=2)
    with pytest.raises(TypeError, match="tensor_parallel"):
        fdl.Config(VFMParallelStrategy, tensor_parallel=2)


def test_every_field_is_documented():
    tree = ast.parse(Path(inspect.getsourcefile(ParallelConfig)).read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ParallelConfig").body
    documented = {a.target.id for a, b in zip(body, body[1:]) if isinstance(a, ast.AnnAssign)
                  and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)}
    assert documented == {f.name for f in dataclasses.fields(ParallelConfig)}


def test_the_strategy_stores_one_config_and_passes_the_family_knobs():
    s = VFMParallelStrategy(tensor_model_parallel_size=2, sequence_parallel=True, activation_checkpointing="full",
                            fsdp_reshard_after_forward=False)
    assert s.config.tensor_model_parallel_size == 2 and s.config.layout["tp"] == 2 and s.config.layout["sequence_parallel"]
    assert s.parallelize_kwargs == {
        "activation_checkpointing": "full", "activation_checkpointing_every": 2, "activation_checkpointing_blocks": None,
        "compile": "auto", "fuse_qkv": True,
        "float8": None, "float8_modules": "mlp", "param_dtype": "bf16", "reduce_dtype": "fp32",
        "attention_backend": "auto", "fsdp_reshard_after_forward": False, "factorized_context_parallel": "hybrid",
        "factorized_context_parallel_chunks": 1, "context_parallel_a2a_chunks": 1, "cpu_offload": False}


@pytest.mark.parametrize("kw, match", [
    (dict(activation_checkpointing="most"), "activation_checkpointing must be one of"),
    (dict(compile="yes"), "compile must be True, False or 'auto'"),
    (dict(activation_checkpointing="full", activation_checkpointing_blocks=0), "an int >= 1 or None"),
    (dict(activation_checkpointing="selective", activation_checkpointing_blocks=4), "'selective' does not read it"),
    (dict(activation_checkpointing_blocks=4), "'none' does not read it"),
    (dict(expert_model_parallel_size=2, fsdp=False), "set fsdp=True"),
    (dict(cpu_offload=True, fsdp=False), "cpu_offload=True is FSDP2's CPUOffloadPolicy; set fsdp=True"),
    (dict(block_swap=-1), "block_swap must be an int >= 0"),
    (dict(activation_offload=1), "activation_offload and cpu_offload must be True or False"),
    (dict(block_swap=2, pipeline_model_parallel_size=2), "not implemented with pipeline parallelism"),
    (dict(attention_backend="fastest"), "attention_backend must be one of"),
    (dict(attention_backend="efficient", context_parallel_size=2), "has no ring attention block kernel"),
    (dict(factorized_context_parallel_chunks=0), "factorized_context_parallel_chunks must be an int >= 1"),
    (dict(context_parallel_a2a_chunks=0), "context_parallel_a2a_chunks must be an int >= 1"),
    (dict(context_parallel_a2a_chunks=2, context_parallel_size=2), "needs context_parallel_size > 1 and "
                                                                   "context_parallel_kind='a2a'"),
    (dict(factorized_context_parallel_chunks=2), "needs context_parallel_size > 1 and factorized_context_parallel="),
    (dict(factorized_context_parallel_chunks=2, context_parallel_size=2, factorized_context_parallel="ring"),
     "needs context_parallel_size > 1 and factorized_context_parallel="),
])
def test_bad_settings_fail_when_built(kw, match):
    with pytest.raises(ValueError, match=match):
        ParallelConfig(**kw)
    with pytest.raises(ValueError, match=match):
        VFMParallelStrategy(**kw)
