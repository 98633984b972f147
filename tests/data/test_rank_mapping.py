"""Data is split by data-parallel rank only: TP/CP peers get identical batches, DP ranks disjoint ones."""

import itertools

import pytest

from nemo_vfm.data.energon_datamodule import EnergonDataModule
from nemo_vfm.data.rank_mapping import dp_rank_world

DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


class _Sub:
    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def get_local_rank(self):
        return self._rank

    def get_group(self):
        return None


class FakeMesh:
    """A DeviceMesh stand-in: this process's coordinate along each named dim."""

    mesh_dim_names = DIMS

    def __init__(self, shape, coord):
        self.shape, self.coord = dict(zip(DIMS, shape)), dict(zip(DIMS, coord))

    def __getitem__(self, name):
        return _Sub(self.shape[name], self.coord[name])

    def get_group(self, name):
        return None


class FakeParallelMesh:
    """nemo_vfm.parallel.mesh.ParallelMesh stand-in: a flattened ``dp`` sub-mesh."""

    def __init__(self, dp_size, dp_rank):
        self.subs = {"dp": _Sub(dp_size, dp_rank)}

    def get(self, name):
        return self.subs[name]


def test_dp_rank_ignores_tp_cp_pp():
    shape = (2, 2, 2, 2, 2)  # pp, dp_replicate, dp_shard, cp, tp: 32 ranks, 4 data-parallel ranks
    seen = {}
    for coord in itertools.product(*(range(n) for n in shape)):
        rank, world, _ = dp_rank_world(FakeMesh(shape, coord))
        assert world == 4
        seen.setdefault(rank, set()).add((coord[1], coord[2]))
    assert sorted(seen) == [0, 1, 2, 3] and all(len(v) == 1 for v in seen.values())
    assert dp_rank_world(FakeParallelMesh(8, 5)) == (5, 8, None)
    with pytest.raises(ValueError, match="not dimensions"):
        dp_rank_world(FakeMesh(shape, (0,) * 5), dp_dims=("data",))


def _keys(path, mesh, n=6):
    dm = EnergonDataModule(str(path), micro_batch_size=2, shuffle_buffer_size=None, mesh=mesh)
    it = iter(dm.train_dataloader())
    return [tuple(next(it).sample_keys) for _ in range(n)]


def test_tp_peers_same_data_dp_ranks_disjoint(prepared):
    shape = (1, 1, 2, 1, 2)  # dp_shard=2 x tp=2
    a0 = _keys(prepared, FakeMesh(shape, (0, 0, 0, 0, 0)))
    a1 = _keys(prepared, FakeMesh(shape, (0, 0, 0, 0, 1)))  # tensor-parallel peer of a0
    b0 = _keys(prepared, FakeMesh(shape, (0, 0, 1, 0, 0)))  # other data-parallel rank
    assert a0 == a1
    first_a = {k for batch in a0[:2] for k in batch}
    first_b = {k for batch in b0[:2] for k in batch}
    assert not first_a & first_b
