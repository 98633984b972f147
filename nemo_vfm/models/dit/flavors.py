"""Named DiT sizes. ``dit_config("xl", in_channels=16)`` returns a :class:`DiTConfig`.

| flavor | layers | hidden | heads | notes |
|---|---|---|---|---|
| s, b, l, xl | 12 / 12 / 24 / 28 | 384 / 768 / 1024 / 1152 | 6 / 12 / 16 / 16 | DiT paper sizes |
| 7b | 28 | 4096 | 32 | cross-attention, AdaLN-LoRA rank 256 |
| 14b | 36 | 5120 | 40 | cross-attention, AdaLN-LoRA rank 256 |
| 28b | 48 | 6144 | 48 | cross-attention, AdaLN-LoRA rank 256 |
| tiny | 2 | 64 | 4 | tests |
| quickstart | 4 | 128 | 4 | the CPU demo |
"""

from nemo_vfm.models.dit.model import DiTConfig

FLAVORS: dict[str, dict] = {
    "tiny": dict(num_layers=2, hidden_size=64, num_heads=4),
    "quickstart": dict(num_layers=4, hidden_size=128, num_heads=4),
    "s": dict(num_layers=12, hidden_size=384, num_heads=6),
    "b": dict(num_layers=12, hidden_size=768, num_heads=12),
    "l": dict(num_layers=24, hidden_size=1024, num_heads=16),
    "xl": dict(num_layers=28, hidden_size=1152, num_heads=16),
    "7b": dict(num_layers=28, hidden_size=4096, num_heads=32, adaln_lora_rank=256),
    "14b": dict(num_layers=36, hidden_size=5120, num_heads=40, adaln_lora_rank=256),
    "28b": dict(num_layers=48, hidden_size=6144, num_heads=48, adaln_lora_rank=256),
}

# The original DiT (Peebles & Xie): class-conditional on ImageNet, 2D sin-cos, patch 2, learned sigma,
# 4-channel SD-VAE latents, no QK-norm, no cross-attention, DDPM timestep index as time input.
ORIGINAL_DIT = dict(patch_size=(1, 2, 2), in_channels=4, qk_norm=False, context_dim=None, pos_embed="sincos2d",
                    num_classes=1000, learned_sigma=True, timestep_scale=1.0)


def dit_config(flavor: str, **overrides) -> DiTConfig:
    """Config for a named flavor with keyword overrides (e.g. ``in_channels=16, context_dim=4096``)."""
    key = flavor.lower().removeprefix("dit-").removeprefix("dit_")
    if key not in FLAVORS:
        raise ValueError(f"unknown DiT flavor {flavor!r}; choose one of: {', '.join(FLAVORS)}")
    return DiTConfig(**{**FLAVORS[key], **overrides})


def original_dit_config(flavor: str = "xl", **overrides) -> DiTConfig:
    """Config matching the published ``DiT-{S,B,L,XL}-2`` checkpoints (256 or 512 px: positions follow the input)."""
    return dit_config(flavor, **{**ORIGINAL_DIT, **overrides})
