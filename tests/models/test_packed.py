"""Packed (THD) forward passes equal per-sample unpacked ones; padding is invisible; the loss runs."""

import pytest
import torch

from nemo_vfm.data.batch import TokenSample, patchify
from nemo_vfm.data.packing import pack_samples
from nemo_vfm.models.common.packed import PackedAttention, packed_seqs
from nemo_vfm.models.dit.model import DiTConfig, build_dit

PATCH = (1, 2, 2)
SHAPES = [(4, 1, 4, 6), (4, 3, 4, 4), (4, 2, 6, 2), (4, 1, 2, 2)]  # (C, t, h, w): images (t=1) and videos


def _samples(ctx_dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, shape in enumerate(SHAPES):
        lat = torch.randn(shape, generator=g)
        text = torch.randn(2 + i, ctx_dim, generator=g)
        tokens, pos = patchify(lat, PATCH)
        out.append((lat, text, TokenSample(key=f"s{i}", tokens=tokens, pos_ids=pos, loss_mask=torch.ones(len(tokens)),
                                           text=text, latent_shape=shape, patch_size=PATCH, fps=8.0 + i,
                                           num_real_tokens=len(tokens))))
    return out


@pytest.mark.parametrize("cfg_kw", [
    dict(pos_embed="rope3d", adaln_lora_rank=0, learned_sigma=False),
    dict(pos_embed="rope3d", adaln_lora_rank=4, learned_sigma=True, rope_base_fps=8.0, fps_embed=True),
    dict(pos_embed="sincos3d", adaln_lora_rank=0, learned_sigma=False, mlp="swiglu"),
])
@pytest.mark.parametrize("pad", [1, 8])
def test_packed_forward_equals_unpacked(cfg_kw, pad):
    torch.manual_seed(0)
    cfg = DiTConfig(num_layers=2, hidden_size=48, num_heads=4, in_channels=4, patch_size=PATCH, context_dim=16, **cfg_kw)
    net = build_dit(cfg)
    for p in net.parameters():  # adaLN-Zero starts at the identity: randomise so every path matters
        torch.nn.init.normal_(p, std=0.1)
    data = _samples()
    batch = pack_samples([s for _, _, s in data], pad_to_multiple=pad)
    t = torch.tensor([0.1, 0.5, 0.9, 0.3])
    fps = batch.fps
    with torch.no_grad():
        out = net(batch.tokens, t, context=batch.text, fps=fps, packed=batch)
        for g, (lat, text, _) in enumerate(data):
            ref = net(lat[None], t[g:g + 1], context=text[None], context_mask=torch.ones(1, len(text), dtype=torch.bool),
                      fps=fps[g:g + 1])[0]
            a = int(batch.cu_seqlens[g])
            got_tokens = out[a:a + int(batch.seq_lens[g])]
            want_tokens, _ = patchify(ref[: lat.shape[0]], PATCH)
            if cfg.learned_sigma:  # mean first, then variance, each in (pt ph pw C) order
                var_tokens, _ = patchify(ref[lat.shape[0]:], PATCH)
                want_tokens = torch.cat([want_tokens, var_tokens], 1)
            torch.testing.assert_close(got_tokens, want_tokens, atol=1e-5, rtol=1e-5)


def test_per_token_timesteps_match_per_segment():
    cfg = DiTConfig(num_layers=1, hidden_size=32, num_heads=2, in_channels=4, patch_size=PATCH, context_dim=16)
    net = build_dit(cfg)
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.1)
    batch = pack_samples([s for _, _, s in _samples()], pad_to_multiple=4)
    t = torch.tensor([0.2, 0.4, 0.6, 0.8])
    with torch.no_grad():
        a = net(batch.tokens, t, context=batch.text, packed=batch)
        b = net(batch.tokens, t[batch.seg_ids], context=batch.text, packed=batch)
    torch.testing.assert_close(a, b)


def test_padding_segments_are_isolated():
    batch = pack_samples([s for _, _, s in _samples()], pad_to_multiple=8)
    ps = packed_seqs(batch)
    real = torch.zeros(batch.tokens.shape[0], dtype=torch.bool)
    for g in range(batch.num_segments):
        a = int(batch.cu_seqlens[g])
        real[a:a + int(batch.seq_lens[g])] = True
    seg = ps.self_attn.seg_q
    # no real token shares a segment id with a padding token
    assert not (set(seg[real].tolist()) & set(seg[~real].tolist()))
    assert int(ps.self_attn.cu_q[-1]) == batch.tokens.shape[0]


def test_packed_training_loss_backward():
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.diffusion.flow_matching import FlowMatching
    from nemo_vfm.diffusion.packed import packed_training_loss

    cfg = DiTConfig(num_layers=1, hidden_size=32, num_heads=2, in_channels=4, patch_size=PATCH, context_dim=16)
    net = build_dit(cfg)
    batch = pack_samples([s for _, _, s in _samples()], pad_to_multiple=8)
    for obj in (EDM(), FlowMatching()):
        net.zero_grad()
        loss, logs = packed_training_loss(obj, net, batch, torch.Generator().manual_seed(0), cond_dropout=0.5)
        assert torch.isfinite(loss) and "mse" in logs
        loss.backward()
        assert net.final_layer.linear.weight.grad.abs().sum() > 0


@pytest.mark.gpu
def test_varlen_backend_matches_mask_fallback():
    torch.manual_seed(0)
    lens_q, lens_k = [5, 17, 1, 33], [3, 7, 1, 12]
    hn, dh = 4, 64
    q = torch.randn(1, hn, sum(lens_q), dh, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, hn, sum(lens_k), dh, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu = lambda ls: torch.tensor([0] + list(torch.tensor(ls).cumsum(0)), dtype=torch.int32, device="cuda")
    seg = lambda ls: torch.repeat_interleave(torch.arange(len(ls), device="cuda"), torch.tensor(ls, device="cuda"))
    args = (cu(lens_q), cu(lens_k), max(lens_q), max(lens_k), seg(lens_q), seg(lens_k))
    a = PackedAttention(*args, backend="varlen")(q, k, v)
    b = PackedAttention(*args, backend="mask")(q.float(), k.float(), v.float())
    torch.testing.assert_close(a.float(), b, atol=2e-2, rtol=2e-2)
    for lo, hi in ((0, 28), (10, 40), (30, 56)):  # a CP rank's query slice: keys narrowed, cu_k from 0
        part = PackedAttention(*args, backend="varlen").restrict_queries(lo, hi)
        torch.testing.assert_close(part(q[:, :, lo:hi], k, v).float(), b[:, :, lo:hi], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("lo, hi", [(0, 16), (16, 32), (8, 24), (20, 21), (0, 32)])
def test_cross_attention_restricted_to_a_query_slice(lo, hi):
    """A context-parallel rank's queries ``lo:hi`` (cutting segments anywhere) read what they read unsplit."""
    batch = pack_samples([s for _, _, s in _samples()], pad_to_multiple=4)  # segments 0:8, 8:20, 20:28, 28:32
    cross = packed_seqs(batch).cross_attn
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, batch.tokens.shape[0], 8, generator=g)
    k, v = (torch.randn(1, 2, batch.text.shape[0], 8, generator=g) for _ in range(2))
    part = cross.restrict_queries(lo, hi)
    torch.testing.assert_close(part(q[:, :, lo:hi], k, v), cross(q, k, v)[:, :, lo:hi])
    a, b = part.k_range
    assert part.cu_q[-1] == hi - lo and part.cu_k[0] == 0 and part.cu_k[-1] == b - a
