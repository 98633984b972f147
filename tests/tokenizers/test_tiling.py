"""Tiled / chunked encode and decode match the untiled path (tolerances documented in tiling.py)."""

import pytest
import torch
from conftest import rel_err, tiny_causal

from nemo_vfm.tokenizers.base import VideoTokenizer
from nemo_vfm.tokenizers.identity import IdentityTokenizer
from nemo_vfm.tokenizers.tiling import TiledTokenizer, TilingConfig


@pytest.mark.parametrize("tc,sc,p,chunk", [(4, 8, 1, None), (4, 8, 1, 1), (8, 8, 1, 1), (8, 16, 2, 2)])
def test_tiled_equals_untiled_for_our_tokenizer(tc, sc, p, chunk):
    tok = tiny_causal(tc, sc, p)
    torch.manual_seed(2)
    x = torch.rand(1, 3, 1 + 2 * tc, 64, 64 + 2 * sc) * 2 - 1
    z, y = tok.encode(x), tok.decode(tok.encode(x))
    tiled = TiledTokenizer(tok, tile_size=32, tile_overlap=sc, chunk_latents=chunk)  # 3x3 tiles or more
    assert tiled.encode_halo > 0 and tiled.decode_halo > 0  # its receptive field makes tiling exact
    assert rel_err(tiled.encode(x), z) < 1e-4
    assert rel_err(tiled.decode(z), y) < 1e-4


def test_tiles_without_halo_blend_close_to_untiled(video):
    tok = tiny_causal(4, 8)
    z = tok.encode(video)
    approx = TiledTokenizer(tok, tile_size=48, tile_overlap=32, tile_halo=0).encode(video)
    assert approx.shape == z.shape
    assert 1e-4 < float((approx - z).abs().mean() / z.std()) < 0.5  # approximate, but blended, not garbage


class MeanPoolCausal(VideoTokenizer):
    """A causal tokenizer without streaming support: frame 0 alone, then means over groups of 4 frames."""

    temporal_compression, spatial_compression, latent_channels, causal = 4, 1, 3, True

    def encode(self, video):
        self.latent_shape(*video.shape[2:])
        rest = video[:, :, 1:]
        b, c, t, h, w = rest.shape
        groups = rest.reshape(b, c, t // 4, 4, h, w).mean(3)
        return torch.cat([video[:, :, :1], groups], dim=2) + video[:, :, :1] * 0.5  # depends on frame 0

    def decode(self, z):
        first = z[:, :, :1] / 1.5
        return torch.cat([first, (z[:, :, 1:] - 0.5 * first).repeat_interleave(4, dim=2)], dim=2)


def test_generic_temporal_chunks_keep_causal_context():
    tok = MeanPoolCausal()
    x = torch.rand(1, 3, 17, 8, 8)
    z = tok.encode(x)
    # with enough context the re-encoded sub-clips reproduce every kept latent (frame 0 dependence included
    # only when the sub-clip starts at frame 0, so context must reach it: 4 latents here)
    chunked = TiledTokenizer(tok, tile_size=1024, chunk_latents=2, context_latents=4)
    assert torch.allclose(chunked.encode(x), z, atol=1e-6)
    assert chunked.decode(z).shape == x.shape
    assert torch.allclose(chunked.decode(z), tok.decode(z), atol=1e-6)


def test_identity_tiles_exactly_and_non_causal_chunking_is_refused():
    tok = IdentityTokenizer(spatial_compression=4)
    x = torch.rand(1, 3, 2, 40, 56)
    tiled = TiledTokenizer(tok, TilingConfig(tile_size=16, tile_overlap=8))
    assert torch.allclose(tiled.encode(x), tok.encode(x)) and torch.allclose(tiled.decode(tok.encode(x)), x)
    with pytest.raises(ValueError, match="needs a causal tokenizer"):
        TiledTokenizer(tok, chunk_latents=2)
    with pytest.raises(ValueError, match="tile_overlap must be in"):
        TilingConfig(tile_size=64, tile_overlap=64)
