"""Named MovieGen sizes. ``moviegen_config("5b", in_channels=16)`` returns a :class:`MovieGenConfig`.

| flavor | layers | hidden | heads | KV heads | ffn |
|---|---|---|---|---|---|
| 1b | 16 | 2048 | 32 | 32 | 8192 |
| 3b | 28 | 3072 | 24 | 24 | 8192 |
| 5b | 32 | 3072 | 24 | 24 | 8192 |
| 30b | 48 | 6144 | 48 | 48 | 16384 |
| tiny | 2 | 64 | 4 | 2 | 128 (tests) |

Parameters with 4096-dim text cross-attention: 1.52B, 4.49B, 5.12B, 28.1B; without it 1.11B, 3.26B, 3.71B,
22.1B (NeMo's DiT-Llama 1B and 3B are named by the latter). 30B is the MovieGen paper's shape (48 layers,
6144 hidden, FFN 16384, 48 heads, no key/value grouping); the published ~30B also counts the text
projections at model width. ``num_kv_heads=8`` gives NeMo's grouped-query variant (25.1B).
"""

from nemo_vfm.models.moviegen.model import MovieGenConfig

FLAVORS: dict[str, dict] = {
    "tiny": dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_size=128, max_grid=(16, 16, 16)),
    "1b": dict(num_layers=16, hidden_size=2048, num_heads=32, ffn_size=8192),
    "3b": dict(num_layers=28, hidden_size=3072, num_heads=24, ffn_size=8192),
    "5b": dict(num_layers=32, hidden_size=3072, num_heads=24, ffn_size=8192),
    "30b": dict(num_layers=48, hidden_size=6144, num_heads=48, ffn_size=16384),  # the MovieGen paper's shape
}


def moviegen_config(flavor: str, **overrides) -> MovieGenConfig:
    """Config for a named flavor (``1b``, ``3b``, ``5b``, ``30b``, ``tiny``; ``moviegen-`` prefix optional)."""
    key = flavor.lower().replace("_", "-").removeprefix("moviegen-").removeprefix("movie-gen-")
    if key not in FLAVORS:
        raise ValueError(f"unknown MovieGen flavor {flavor!r}; choose one of: {', '.join(FLAVORS)}")
    return MovieGenConfig(**{**FLAVORS[key], **overrides})
