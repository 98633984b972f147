"""Bad layouts fail up front (before any model is built) with messages that name the numbers."""

import pytest

from nemo_vfm.models.dit import family as P
from nemo_vfm.models.dit.flavors import dit_config
from nemo_vfm.parallel.dims import ParallelDims


def test_remaining_ranks_go_to_fsdp():
    d = ParallelDims(world_size=16, tp=2, cp=2)
    assert d.dp_shard == 4 and d.fsdp and d.fsdp_size == 8 and d.dp == 4
    assert ParallelDims(world_size=8, tp=8).fsdp is False


@pytest.mark.parametrize("kw, on", [(dict(world_size=2, tp=2), False), (dict(world_size=2, pp=2), False),
                                    (dict(world_size=2, dp_replicate=2), True), (dict(world_size=1), False),
                                    (dict(world_size=2, cp=2), True), (dict(world_size=4, tp=2), True)])
def test_fsdp_asked_for_is_off_where_a_group_would_hold_one_rank(kw, on):
    """The strategy asks for FSDP by default; over one rank without replicas it would only add gradient copies and
    per-block hooks (with replicas, HSDP reduces the gradients across them)."""
    d = ParallelDims(fsdp=True, **kw)
    assert d.fsdp is on and d.fsdp_size == (d.dp_shard * d.cp if on else 1)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(world_size=6, tp=4), ["world size 6", "dp_replicate*cp*tp*pp", "4"]),
        (dict(world_size=8, tp=2, cp=2, dp_shard=4), ["16", "world size 8"]),
        (dict(world_size=2, sequence_parallel=True), ["sequence_parallel", "tp"]),
        (dict(world_size=4, dp_shard=2, dp_replicate=2, fsdp=False), ["dp_shard=2", "fsdp=True"]),
        (dict(world_size=2, cp=2, cp_kind="ulysses"), ["cp_kind", "ulysses"]),
        (dict(world_size=2, pp=2, pp_schedule="zb"), ["pp_schedule", "zb"]),
    ],
)
def test_inconsistent_layouts(kw, words):
    with pytest.raises(ValueError) as e:
        ParallelDims(**kw)
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize(
    "flavor, kw, latent, words",
    [
        ("7b", dict(tp=3), None, ["num_heads=32", "tp=3"]),
        ("7b", dict(pp=3), None, ["num_layers=28", "3 pipeline stages"]),
        ("7b", dict(pp=2, pp_schedule="interleaved", pp_virtual_stages=4), None, ["num_layers=28", "8 pipeline"]),
        ("7b", dict(cp=2, pp=2), (3, 10, 10), ["75 video tokens", "cp*tp(sp) = 2", "76"]),  # PP stages: no padding
        ("7b", dict(tp=8, cp=8, cp_kind="a2a"), None, ["heads per TP rank", "32/8 = 4", "cp=8"]),
    ],
)
def test_model_does_not_divide(flavor, kw, latent, words):
    cfg = dit_config(flavor)
    world = 1
    for k in ("tp", "cp", "pp"):
        world *= kw.get(k, 1)
    dims = ParallelDims(world_size=world, **kw)
    with pytest.raises(ValueError) as e:
        P.check_layout(cfg, dims, latent)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_good_layout_passes():
    P.check_layout(dit_config("7b"), ParallelDims(world_size=8, tp=2, cp=4, sequence_parallel=True), (16, 88, 160))
    P.check_layout(dit_config("7b"), ParallelDims(world_size=2, cp=2), (3, 10, 10))  # 75 tokens: padded to 76
