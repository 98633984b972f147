"""Published Cosmos-Predict2.5 sizes (diffusers' ``convert_cosmos_to_diffusers.py`` configs
``Cosmos-2.5-Predict-Base-2B`` / ``-14B``). ``cosmos_config("2b")`` returns a :class:`CosmosConfig`.

| flavor | layers | hidden | heads | MLP | latent channels | text | RoPE scale (t, h, w) |
|---|---|---|---|---|---|---|---|
| predict2_5_2b | 28 | 2048 | 16 | 8192 | 16 (+ condition mask + padding mask) | Qwen2.5-VL-7B, 100352 -> 1024 | (1, 3, 3) |
| predict2_5_14b | 36 | 5120 | 40 | 20480 | as 2B | as 2B | (1, 3, 3) |
| tiny | 2 | 64 | 2 | 256 | 4 | 32 -> 16 | (1, 3, 3) |

Both sample 93 frames at 704x1280 (the Wan 2.1 VAE: 4x8x8, 16 channels; 24 x 88 x 160 latents) as diffusers'
``Cosmos2_5_PredictBasePipeline`` does: UniPC on Karras flow sigmas (0.01 to 200), 36 steps, guidance 7.0 applied
as ``cond + 7 (cond - uncond)``; Video2World conditions on 1 or 2 clean latent frames
(:mod:`nemo_vfm.diffusion.conditioning_frames`). Training (the release's configs): flow matching, logit-normal
times shifted by 5.
"""

from nemo_vfm.models.cosmos.model import CosmosConfig

FLAVORS: dict[str, dict] = {
    "tiny": dict(num_layers=2, hidden_size=64, num_heads=2, in_channels=4, out_channels=4, context_dim=32,
                 text_dim=16, adaln_lora_dim=8),
    "predict2_5_2b": dict(num_layers=28, hidden_size=2048, num_heads=16),
    "predict2_5_14b": dict(num_layers=36, hidden_size=5120, num_heads=40),
}
# the pipeline's defaults (guidance as it applies it: cond + g (cond - uncond))
SAMPLING: dict[str, dict] = {
    "tiny": dict(size=(32, 32), frames=5, steps=4, guidance=7.0),
    "predict2_5_2b": dict(size=(704, 1280), frames=93, fps=16.0, steps=36, guidance=7.0),
    "predict2_5_14b": dict(size=(704, 1280), frames=93, fps=16.0, steps=36, guidance=7.0),
}


def _key(flavor: str) -> str:
    key = flavor.lower().replace("-", "_").replace(".", "_").removeprefix("cosmos_")
    key = {"2b": "predict2_5_2b", "14b": "predict2_5_14b"}.get(key, key)
    if key not in FLAVORS:
        raise ValueError(f"unknown Cosmos flavor {flavor!r}; choose one of: {', '.join(FLAVORS)}")
    return key


def cosmos_config(flavor: str, **overrides) -> CosmosConfig:
    """Config for a named flavor with keyword overrides (e.g. ``pretrained="/path/to/Cosmos-Predict2.5-2B"``)."""
    return CosmosConfig(**{**FLAVORS[_key(flavor)], **overrides})


def flavor_of(cfg: CosmosConfig) -> str | None:
    """The published flavor whose architecture ``cfg`` has, or None."""
    arch = {k: v for k, v in vars(cfg).items() if k != "pretrained"}
    for name, kw in FLAVORS.items():
        if {k: v for k, v in vars(CosmosConfig(**kw)).items() if k != "pretrained"} == arch:
            return name
    return None
