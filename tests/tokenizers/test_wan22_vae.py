"""The Wan 2.2 VAE (AutoencoderKLWan with is_residual and 2x2 patches: 4x16x16) as the ``wan2_2`` tokenizer:
latents and reconstructions equal diffusers' on a tiny config of that shape; a Wan 2.1 VAE is refused by name."""

import pytest
import torch

from nemo_vfm.tokenizers.registry import build_tokenizer, tokenizer_from_spec

diffusers = pytest.importorskip("diffusers")


def tiny_wan22_vae():
    torch.manual_seed(0)
    return diffusers.AutoencoderKLWan(base_dim=8, decoder_base_dim=12, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                      temperal_downsample=[False, True, True], is_residual=True, in_channels=12,
                                      out_channels=12, patch_size=2, scale_factor_spatial=16,
                                      latents_mean=[0.1, 0.2, 0.3, 0.4], latents_std=[2.0, 2.0, 3.0, 3.0]).eval()


def test_wan22_vae_round_trip_matches_diffusers(tmp_path):
    vae = tiny_wan22_vae()
    vae.save_pretrained(tmp_path / "pipe" / "vae")
    tok = tokenizer_from_spec(f"wan2_2:path={tmp_path / 'pipe'}")
    assert (tok.temporal_compression, tok.spatial_compression, tok.latent_channels, tok.causal) == (4, 16, 4, True)
    x = torch.rand(1, 3, 5, 32, 64, generator=torch.Generator().manual_seed(1)) * 2 - 1
    z = tok.encode(x)
    assert z.shape == (1, 4, 2, 2, 4)
    mean, std = torch.tensor([0.1, 0.2, 0.3, 0.4]).view(1, 4, 1, 1, 1), torch.tensor([2.0, 2.0, 3.0, 3.0]).view(1, 4, 1, 1, 1)
    with torch.no_grad():
        ref_z = vae.encode(x).latent_dist.mode()
        ref_x = vae.decode(ref_z).sample
    assert (z - (ref_z - mean) / std).abs().max() <= 1e-5
    assert (tok.decode(z) - ref_x).abs().max() <= 1e-5
    assert tok.decode(z).shape == x.shape
    # the first latent frame encodes the first pixel frame alone (causal): what TI2V conditions on
    z1 = tok.encode(x[:, :, :1])
    assert (z1[:, :, 0] - z[:, :, 0]).abs().max() <= 1e-5


def test_wan21_vae_is_refused_as_wan22(tmp_path):
    diffusers.AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                               latents_mean=[0.0] * 4, latents_std=[1.0] * 4).save_pretrained(tmp_path / "vae")
    with pytest.raises(ValueError, match="not the Wan 2.2 VAE"):
        build_tokenizer("wan2_2", path=str(tmp_path))
    assert build_tokenizer("wan", path=str(tmp_path)).spatial_compression == 8
