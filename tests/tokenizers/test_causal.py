"""Our causal tokenizer: shapes, round trip, causality, streaming, checkpoints, errors."""

import pytest
import torch
from conftest import rel_err, tiny_causal

from nemo_vfm.tokenizers.causal import CausalTokenizerConfig, CausalVideoTokenizer


@pytest.mark.parametrize("tc,sc,p", [(4, 8, 1), (8, 8, 1), (8, 16, 2)])
def test_shapes_and_round_trip(tc, sc, p):
    tok = tiny_causal(tc, sc, p)
    for frames in (1, 1 + tc, 1 + 2 * tc):  # an image is one latent frame
        x = torch.rand(2, 3, frames, 32, 48) * 2 - 1
        z = tok.encode(x)
        assert z.shape == (2, 4, 1 + (frames - 1) // tc, 32 // sc, 48 // sc)
        assert tok.latent_shape(frames, 32, 48) == tuple(z.shape[2:])
        y = tok.decode(z)
        assert y.shape == x.shape and tok.pixel_shape(*z.shape[2:]) == (frames, 32, 48)
        assert torch.isfinite(y).all()


@pytest.mark.parametrize("tc,sc,p", [(4, 8, 1), (8, 16, 2)])
def test_first_frame_is_encoded_on_its_own(tc, sc, p):
    tok = tiny_causal(tc, sc, p)
    x = torch.rand(1, 3, 1 + 2 * tc, 32, 32) * 2 - 1
    z = tok.encode(x)
    assert rel_err(tok.encode(x[:, :, :1]), z[:, :, :1]) < 1e-4
    later = x.clone()
    later[:, :, 1 + tc:] = -later[:, :, 1 + tc:]  # change only the frames of the last latent
    z2 = tok.encode(later)
    assert rel_err(z2[:, :, :2], z[:, :, :2]) < 1e-4 and rel_err(z2[:, :, 2:], z[:, :, 2:]) > 1e-2
    # the decoder is causal too: latent 0 alone decodes to the first frame
    assert rel_err(tok.decode(z[:, :, :1]), tok.decode(z)[:, :, :1]) < 1e-4


def test_streaming_equals_whole_clip(video):
    tok = tiny_causal()
    z = tok.encode_raw(video)
    for chunk in (1, 2):
        assert rel_err(tok.encode_raw(video, chunk_latents=chunk), z) < 1e-4
        assert rel_err(tok.decode_raw(z, chunk_latents=chunk), tok.decode_raw(z)) < 1e-4


def test_latent_normalization_and_checkpoint(tmp_path, video):
    tok = tiny_causal()
    raw = tok.encode_raw(video)
    shift, scale = raw.mean(dim=(0, 2, 3, 4)), raw.std(dim=(0, 2, 3, 4))
    tok.set_latent_stats(shift, scale)
    z = tok.encode(video)
    assert z.mean(dim=(0, 2, 3, 4)).abs().max() < 1e-4 and (z.std(dim=(0, 2, 3, 4)) - 1).abs().max() < 1e-4
    assert rel_err(tok.decode(z), tok.decode_raw(raw)) < 1e-4
    tok.save_checkpoint(tmp_path / "tokenizer.pt")
    loaded = CausalVideoTokenizer.from_checkpoint(tmp_path)  # the file, or the directory holding tokenizer.pt
    assert torch.equal(loaded.encode(video), z) and loaded.config == tok.config


def test_errors_name_what_works():
    tok = tiny_causal(4, 8)
    with pytest.raises(ValueError, match=r"multiples of 8 .*nearest: 32x40.*1 \+ 4\*k .*nearest: 9 or 13"):
        tok.encode(torch.zeros(1, 3, 10, 36, 44))
    with pytest.raises(ValueError, match="temporal_compression must be one of"):
        CausalTokenizerConfig(temporal_compression=3)
    with pytest.raises(ValueError, match="spatial_compression must be patch_size"):
        CausalTokenizerConfig(spatial_compression=12)
    with pytest.raises(ValueError, match="bottleneck must be one of"):
        CausalTokenizerConfig(bottleneck="vq")
    with pytest.raises(FileNotFoundError, match="tokenizer.pt"):
        CausalVideoTokenizer.from_checkpoint("/nonexistent/dir")


def test_autoencode_is_differentiable():
    tok = tiny_causal(bottleneck="kl").train()
    x = torch.rand(2, 3, 5, 16, 16) * 2 - 1
    rec, mean, logvar = tok.autoencode(x)
    assert rec.shape == x.shape and logvar is not None and mean.shape == (2, 4, 2, 2, 2)
    rec.abs().mean().backward()
    assert all(p.grad is not None for p in tok.encoder.parameters())
