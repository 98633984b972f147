"""Parallel fiddlers compose on a recipe, serialize, and build a valid strategy."""

import fiddle as fdl
import pytest

from nemo_vfm.parallel.dims import ParallelDims

run = pytest.importorskip("nemo_run")


def test_fiddlers_compose_and_build():
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm_recipes import dit, parallel

    recipe = parallel.with_cp(parallel.with_tp(dit.pretrain_7b(), 2), 4, kind="a2a")
    recipe = parallel.with_fsdp(recipe, activation_checkpointing="full")
    s = recipe.trainer.strategy
    assert (s.tensor_model_parallel_size, s.sequence_parallel, s.context_parallel_size) == (2, True, 4)
    assert s.context_parallel_kind == "a2a" and s.fsdp and s.activation_checkpointing == "full"
    strategy = fdl.build(s)
    assert isinstance(strategy, VFMParallelStrategy) and strategy.config.layout["cp"] == 4
    from fiddle.experimental import serialization

    assert "context_parallel_size" in serialization.dump_json(recipe)


def test_default_layouts():
    from nemo_vfm_recipes import dit, parallel

    s8k = dit.pretrain_7b().trainer.strategy  # 8k: FSDP over every GPU, no TP (measured faster, layout_7b)
    assert (s8k.tensor_model_parallel_size, s8k.sequence_parallel, s8k.fsdp) == (1, False, True)
    assert s8k.activation_checkpointing == "selective"
    paper = parallel.layout_7b(dit.pretrain_7b(), tp=2).trainer.strategy
    assert (paper.tensor_model_parallel_size, paper.sequence_parallel, paper.fsdp) == (2, True, True)
    with pytest.raises(ValueError, match="layout_7b"):
        parallel.layout_7b(dit.pretrain_7b(), context="16k")
    s3 = parallel.layout_7b(dit.pretrain_7b(), tp=3).trainer.strategy  # refused where every layout is checked
    with pytest.raises(ValueError, match="not divisible by tensor parallel size tp=3"):
        ParallelDims(world_size=6, tp=s3.tensor_model_parallel_size).check_model(num_heads=32, num_layers=28)
    r7 = parallel.layout_7b(dit.pretrain_7b(), context="74k")
    s7 = r7.trainer.strategy
    assert (s7.tensor_model_parallel_size, s7.context_parallel_size, s7.context_parallel_kind) == (2, 4, "a2a")
    assert s7.compile and s7.activation_checkpointing == "save_attention"  # half of selective's memory, as fast (measured)
    r28 = parallel.layout_28b(dit.pretrain_28b())
    assert r28.trainer.strategy.tensor_model_parallel_size == 4
    assert r28.trainer.strategy.activation_checkpointing == "full"
    with pytest.raises(ValueError, match="kind"):
        parallel.with_cp(dit.pretrain_7b(), 2, kind="ulysses")
    s8 = parallel.with_float8(dit.pretrain_7b()).trainer.strategy
    assert (s8.float8, s8.float8_modules, s8.compile) == ("tensorwise", "all", True)


def test_with_pp_composes_and_builds():
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm_recipes import dit, parallel

    recipe = parallel.with_pp(parallel.with_tp(dit.pretrain_28b(), 4), 2, schedule="interleaved", microbatches=8)
    s = recipe.trainer.strategy
    assert (s.pipeline_model_parallel_size, s.pipeline_schedule, s.microbatches) == (2, "interleaved", 8)
    assert s.tensor_model_parallel_size == 4 and s.activation_checkpointing == "full"  # layout_28b's knobs kept
    strategy = fdl.build(s)
    assert isinstance(strategy, VFMParallelStrategy) and strategy.pipeline_parallel
    with pytest.raises(ValueError, match="schedule"):
        parallel.with_pp(dit.pretrain_xl(), 2, schedule="zb")
