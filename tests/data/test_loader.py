"""Energon loading: buckets, packed mixed image/video batches, token layout, exact loader resume."""

import pickle

import torch

from nemo_vfm.data.batch import PackedBatch, VideoBatch, patchify, unpatchify
from nemo_vfm.data.energon_datamodule import EnergonDataModule
from nemo_vfm.models.common.embeddings import PatchEmbed3D


def _take(dm, n):
    loader = dm.train_dataloader()
    it = iter(loader)
    out = []
    for _ in range(n):
        b = next(it)
        dm.on_before_batch_transfer(b, 0)
        out.append(b)
    return out, loader


def test_tokens_match_patch_embed_order():
    lat = torch.randn(12, 3, 8, 6)
    tokens, pos = patchify(lat, (1, 2, 2))
    torch.testing.assert_close(tokens, PatchEmbed3D(12, 8, (1, 2, 2)).patchify(lat[None])[0])
    torch.testing.assert_close(unpatchify(tokens, lat.shape, (1, 2, 2)), lat)
    assert pos[5].tolist() == [0, 1, 2] and pos[-1].tolist() == [2, 3, 2]


def test_buckets_hold_one_shape(prepared):
    dm = EnergonDataModule(str(prepared), micro_batch_size=2, shuffle_buffer_size=8)
    batches, _ = _take(dm, 8)
    assert all(isinstance(b, VideoBatch) and len(b) == 2 for b in batches)
    shapes = {tuple(b.latents.shape[1:]) for b in batches}
    assert len(shapes) >= 3  # several resolutions/lengths, each batch homogeneous
    b = batches[0]
    assert b["context"].shape[:2] == b["context_mask"].shape and b.get("loss_mask") is None
    assert dm.context_dim == 16 and dm.latent_shape[0] == 12


def test_packing_mixes_images_and_videos(prepared):
    cap = 1024
    dm = EnergonDataModule(str(prepared), micro_batch_size=1, max_seq_length=cap, pad_to_multiple=8,
                           packing_buffer_size=10, shuffle_buffer_size=None)
    batches, loader = _take(dm, 6)
    mixed = 0
    for b in batches:
        assert isinstance(b, PackedBatch) and b.tokens.shape[0] <= cap and b.capacity == cap
        assert (torch.diff(b.cu_seqlens) % 8 == 0).all()
        kinds = {bool(m["is_image"]) for m in b.meta}
        shapes = {tuple(s) for s in b.latent_shapes.tolist()}
        mixed += kinds == {True, False} and len(shapes) > 1
        for g in range(b.num_segments):  # every segment is a whole sample, tokens in patch order
            a, n = int(b.cu_seqlens[g]), int(b.seq_lens[g])
            assert n == int(torch.prod(b.latent_shapes[g, 1:] // torch.tensor([1, 2, 2])))
            assert b.loss_mask[a:a + n].all() and not b.loss_mask[a + n:int(b.cu_seqlens[g + 1])].any()
    assert mixed >= 1
    assert 0.5 < loader.packing_efficiency <= 1.0


def test_loader_state_resumes_exact_samples(prepared):
    kw = dict(micro_batch_size=1, max_seq_length=1024, pad_to_multiple=8, packing_buffer_size=6, shuffle_buffer_size=6)
    dm = EnergonDataModule(str(prepared), **kw)
    it = iter(dm.train_dataloader())
    seen = [next(it) for _ in range(8)]
    for b in seen[:3]:  # the training loop consumed 3 batches; the loader ran ahead (prefetch)
        dm.on_before_batch_transfer(b, 0)
    state = pickle.loads(pickle.dumps(dm.state_dict()))  # what goes into the checkpoint
    assert state["dp_world_size"] == 1 and len(state["states"]) == 1
    dm2 = EnergonDataModule(str(prepared), **kw)
    dm2.load_state_dict(state)
    it2 = iter(dm2.train_dataloader())
    resumed = [next(it2) for _ in range(5)]
    assert [b.keys for b in resumed] == [b.keys for b in seen[3:]]
    torch.testing.assert_close(resumed[-1].tokens, seen[-1].tokens)


def test_packing_pads_samples_to_the_cp_sp_split(prepared):
    from types import SimpleNamespace

    import pytest

    from nemo_vfm.parallel.dims import ParallelDims

    kw = dict(micro_batch_size=1, pad_to_multiple=8, packing_buffer_size=6, shuffle_buffer_size=None)
    dm = EnergonDataModule(str(prepared), max_seq_length=960, **kw)
    dm.mesh = SimpleNamespace(dims=ParallelDims(world_size=6, cp=3, tp=2, sequence_parallel=True))
    assert dm._token_split() == 6  # what build_loader fits the padding to
    dm.fit_layout(4)
    assert dm.pad_to_multiple == 8  # already a multiple
    dm.fit_layout(6)
    assert dm.pad_to_multiple == dm.task_encoder.pad_to_multiple == 24
    dm.mesh = None
    batches, _ = _take(dm, 2)
    assert all(b.tokens.shape[0] % 6 == 0 and (torch.diff(b.cu_seqlens) % 24 == 0).all() for b in batches)
    with pytest.raises(ValueError, match="max_seq_length=1024 is not a multiple of 24.*data.max_seq_length=1008"):
        EnergonDataModule(str(prepared), max_seq_length=1024, **kw).fit_layout(6)
