"""Pretrained adapters load from a local folder (tiny random configs here) and round-trip."""

import pytest
import torch

from nemo_vfm.tokenizers.registry import build_tokenizer, tokenizer_from_spec
from nemo_vfm.tokenizers.tiling import TiledTokenizer

diffusers = pytest.importorskip("diffusers")

TINY = {
    "wan": lambda: diffusers.AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                              temperal_downsample=[False, True, True],
                                              latents_mean=[0.1, 0.2, 0.3, 0.4], latents_std=[2.0, 2.0, 3.0, 3.0]),
    "hunyuan": lambda: diffusers.AutoencoderKLHunyuanVideo(
        latent_channels=4, block_out_channels=(8, 16, 16, 16), layers_per_block=1, norm_num_groups=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4, up_block_types=("HunyuanVideoUpBlock3D",) * 4),
    "cosmos_diffusers": lambda: diffusers.AutoencoderKLCosmos(
        latent_channels=4, encoder_block_out_channels=(8, 16, 16, 16), decode_block_out_channels=(16, 16, 16, 16),
        attention_resolutions=(), resolution=32, num_layers=1, patch_size=4, spatial_compression_ratio=8,
        temporal_compression_ratio=4, latents_mean=[0.5] * 8, latents_std=[2.0] * 8),  # (c=4) x (t=2) stats
    "cogvideox": lambda: diffusers.AutoencoderKLCogVideoX(
        latent_channels=4, block_out_channels=(8, 16, 16, 16), layers_per_block=1, norm_num_groups=4,
        down_block_types=("CogVideoXDownBlock3D",) * 4, up_block_types=("CogVideoXUpBlock3D",) * 4),
}


@pytest.mark.parametrize("family", sorted(TINY))
def test_diffusers_family_round_trip(family, tmp_path):
    torch.manual_seed(0)
    vae = TINY[family]()
    vae.save_pretrained(tmp_path / "pipe" / "vae")  # a pipeline folder with vae/ ...
    tok = build_tokenizer(family, path=str(tmp_path / "pipe"))
    assert (tok.temporal_compression, tok.spatial_compression, tok.latent_channels, tok.causal) == (4, 8, 4, True)
    x = torch.rand(1, 3, 9, 32, 32) * 2 - 1
    z = tok.encode(x)
    assert z.shape == (1, 4, 3, 4, 4)
    raw = vae.encode(x).latent_dist.mode()
    assert torch.allclose(tok.denormalize_latents(z), raw, atol=1e-5)  # normalization is undone exactly
    if family == "wan":  # (z - mean) / std per channel
        assert torch.allclose(z[:, 1], (raw[:, 1] - 0.2) / 2.0, atol=1e-5)
    if family == "hunyuan":
        assert torch.allclose(z, raw * vae.config.scaling_factor, atol=1e-5)
    y = tok.decode(z)
    assert y.shape == x.shape and torch.allclose(y, vae.decode(raw).sample, atol=1e-4)
    direct = build_tokenizer(family, path=str(tmp_path / "pipe" / "vae"))  # ... or the VAE folder itself
    assert torch.allclose(direct.encode(x), z, atol=1e-5)


def test_adapter_tiles_and_reports_bad_paths(tmp_path):
    torch.manual_seed(0)
    TINY["wan"]().save_pretrained(tmp_path / "wan")
    tok = tokenizer_from_spec(f"wan:path={tmp_path / 'wan'},tile_size=32,tile_overlap=16")
    assert isinstance(tok, TiledTokenizer)
    x = torch.rand(1, 3, 5, 48, 48) * 2 - 1
    assert tok.encode(x).shape == (1, 4, 2, 6, 6) and tok.decode(tok.encode(x)).shape == x.shape
    with pytest.raises(FileNotFoundError, match="not a local directory"):
        build_tokenizer("wan", path=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="no config.json"):
        build_tokenizer("hunyuan", path=str(tmp_path))


class TinyCosmosEncoder(torch.nn.Module):
    """Stands in for a Cosmos CV4x8x8 encoder.jit: causal 1 + 4k frames -> 1 + k, 8x8 space, 6 channels."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Conv3d(3, 6, (1, 8, 8), stride=(1, 8, 8))

    def forward(self, x):
        z = self.proj(x)
        rest = z[:, :, 1:]
        b, c, t, h, w = rest.shape
        return (torch.cat([z[:, :, :1], rest.reshape(b, c, t // 4, 4, h, w).mean(3)], dim=2),)


class TinyCosmosDecoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.ConvTranspose3d(6, 3, (1, 8, 8), stride=(1, 8, 8))

    def forward(self, z):
        y = self.proj(z)
        return torch.cat([y[:, :, :1], y[:, :, 1:].repeat_interleave(4, dim=2)], dim=2)


def test_cosmos_jit_folder(tmp_path):
    folder = tmp_path / "Cosmos-0.1-Tokenizer-CV4x8x8"
    folder.mkdir()
    torch.manual_seed(0)
    enc, dec = TinyCosmosEncoder(), TinyCosmosDecoder()
    torch.jit.script(enc).save(str(folder / "encoder.jit"))
    torch.jit.trace(dec, torch.zeros(1, 6, 2, 2, 2)).save(str(folder / "decoder.jit"))
    tok = build_tokenizer("cosmos_jit", path=str(folder))
    assert (tok.temporal_compression, tok.spatial_compression, tok.latent_channels) == (4, 8, 6)  # name + probe
    x = torch.rand(2, 3, 9, 16, 24) * 2 - 1
    z = tok.encode(x)
    assert z.shape == (2, 6, 3, 2, 3) and torch.allclose(z, enc(x)[0], atol=1e-5)
    assert torch.allclose(tok.decode(z), dec(z), atol=1e-5)
    torch.save((torch.full((6,), 0.5), torch.full((6,), 2.0)), folder / "mean_std.pt")
    normed = build_tokenizer("cosmos_jit", path=str(folder))
    assert torch.allclose(normed.encode(x), (enc(x)[0] - 0.5) / 2.0, atol=1e-5)
    (folder / "decoder.jit").unlink()
    encode_only = build_tokenizer("cosmos_jit", path=str(folder), latent_channels=6)
    with pytest.raises(RuntimeError, match="no decoder.jit"):
        encode_only.decode(z)
    other = tmp_path / "my_tokenizer"
    other.mkdir()
    (folder / "encoder.jit").rename(other / "encoder.jit")
    with pytest.raises(ValueError, match="pass temporal_compression"):
        build_tokenizer("cosmos_jit", path=str(other))
    assert build_tokenizer("cosmos_jit", path=str(other), temporal_compression=4, spatial_compression=8).latent_channels == 6


def test_vae_runs_under_the_dit_attention_flags(tmp_path):
    """The Wan VAE's mid-block attention runs under the SDPA flags the DiT narrowed (no fused kernel left on the
    CPU: math, the last resort, runs it), with the same result."""
    from nemo_vfm.parallel.sdpa_backend import select_sdpa_backend

    torch.manual_seed(0)
    TINY["wan"]().save_pretrained(tmp_path / "vae")
    tok = build_tokenizer("wan", path=str(tmp_path))
    x = torch.rand(1, 3, 5, 16, 16) * 2 - 1
    ref = tok.decode(tok.encode(x))
    select_sdpa_backend("cudnn")
    try:
        assert torch.allclose(tok.decode(tok.encode(x)), ref, atol=1e-5, rtol=1e-5)  # math vs the CPU's flash kernel
    finally:
        select_sdpa_backend("default")


def test_ltx2_video_vae_normalizes_and_decodes_as_the_pipeline(tmp_path):
    """Tokenizer ``ltx2``: LTX2Pipeline's latent normalization (the VAE's ``latents_mean`` / ``latents_std`` buffers
    and ``scaling_factor``) and, for a timestep-conditioned decoder, its decode at ``decode_timestep=0``."""
    from diffusers import LTX2Pipeline

    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLLTX2Video(
        latent_channels=8, block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 16, 32),
        layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1), timestep_conditioning=True,
        decoder_spatial_padding_mode="zeros", spatial_compression_ratio=32, temporal_compression_ratio=8,
        scaling_factor=0.9).eval()
    with torch.no_grad():
        vae.latents_mean.copy_(0.1 * torch.randn(8))
        vae.latents_std.copy_(1 + 0.2 * torch.rand(8))
    vae.save_pretrained(tmp_path / "pipe" / "vae")
    tok = build_tokenizer("ltx2", path=str(tmp_path / "pipe"))
    assert (tok.temporal_compression, tok.spatial_compression, tok.latent_channels, tok.causal) == (8, 32, 8, True)
    x = torch.rand(1, 3, 9, 64, 64) * 2 - 1
    raw = vae.encode(x).latent_dist.mode()
    z = tok.encode(x)
    ref = LTX2Pipeline._normalize_latents(raw, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    torch.testing.assert_close(z, ref, rtol=0, atol=1e-5)
    with torch.no_grad():
        want = vae.decode(raw, torch.zeros(1)).sample
    torch.testing.assert_close(tok.decode(z), want, rtol=0, atol=1e-4)
