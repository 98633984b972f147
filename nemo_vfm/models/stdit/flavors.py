"""Named ST-DiT sizes. ``stdit_config("xl", in_channels=16)`` returns an :class:`STDiTConfig`.

| flavor | layers | hidden | heads | ffn | notes |
|---|---|---|---|---|---|
| xl | 28 | 1152 | 16 | 4608 | ST-DiT-XL |
| xl-wide | 24 | 1536 | 12 | 6144 | ST-DiT-XL-wide |
| 3b | 24 | 2048 | 16 | 8192 | ST-DiT-3B |
| tiny | 2 | 64 | 4 | 256 | tests (one full-attention block) |
"""

from nemo_vfm.models.stdit.model import STDiTConfig

FLAVORS: dict[str, dict] = {
    "tiny": dict(num_layers=2, hidden_size=64, num_heads=4, ffn_size=256, full_attn_every=2),
    "xl": dict(num_layers=28, hidden_size=1152, num_heads=16, ffn_size=4608),
    "xl-wide": dict(num_layers=24, hidden_size=1536, num_heads=12, ffn_size=6144),
    "3b": dict(num_layers=24, hidden_size=2048, num_heads=16, ffn_size=8192),
}


def stdit_config(flavor: str, **overrides) -> STDiTConfig:
    """Config for a named flavor (``xl``, ``xl-wide``, ``3b``, ``tiny``; ``ST-DiT-`` prefix optional)."""
    key = flavor.lower().replace("_", "-").removeprefix("st-dit-").removeprefix("stdit-")
    if key not in FLAVORS:
        raise ValueError(f"unknown ST-DiT flavor {flavor!r}; choose one of: {', '.join(FLAVORS)}")
    return STDiTConfig(**{**FLAVORS[key], **overrides})
