"""Published Wan 2.1 and 2.2 sizes. ``wan_config("t2v_1_3b")`` returns a :class:`WanConfig`.

| flavor | layers | hidden | heads | FFN | in / out channels | image conditioning | sample size | shift |
|---|---|---|---|---|---|---|---|---|
| t2v_1_3b | 30 | 1536 | 12 | 8960 | 16 / 16 | - | 480x832 | 5.0 |
| t2v_14b | 40 | 5120 | 40 | 13824 | 16 / 16 | - | 720x1280 | 5.0 |
| i2v_14b_480p | 40 | 5120 | 40 | 13824 | 36 / 16 | CLIP ViT-H (1280) tokens + mask/image latents | 480x832 | 3.0 |
| i2v_14b_720p | 40 | 5120 | 40 | 13824 | 36 / 16 | as 480p | 720x1280 | 5.0 |
| ti2v_5b (2.2) | 30 | 3072 | 24 | 14336 | 48 / 48 | optional first frame (clean latent, t = 0) | 704x1280 | 5.0 |
| t2v_a14b (2.2) | 40 | 5120 | 40 | 13824 | 16 / 16 | - (two experts, boundary 0.875) | 720x1280 | 12.0 |
| i2v_a14b (2.2) | 40 | 5120 | 40 | 13824 | 36 / 16 | mask/image latents, no CLIP (two experts, boundary 0.9) | 720x1280 | 5.0 |
| tiny | 2 | 48 | 2 | 64 | 4 / 4 | - | tests | 5.0 |

Text: UMT5-XXL states (4096 wide, 512 tokens). The two I2V checkpoints share the architecture; they
differ in training resolution and in the sampling shift Wan recommends (3.0 at 480p, 5.0 at 720p).
Wan 2.2: TI2V-5B samples with the Wan 2.2 VAE (48 channels, 4x16x16) at 24 fps, 121 frames; each A14B model
is two networks of the Wan 2.1 14B architecture (``transformer``: high noise, t >= boundary; ``transformer_2``:
low noise) with the Wan 2.1 VAE; the shifts, boundaries and guidance scales are the Wan2.2 release's configs.
"""

from nemo_vfm.models.wan.model import WanConfig

_14B = dict(num_layers=40, hidden_size=5120, num_heads=40, ffn_size=13824)
_I2V = dict(in_channels=36, out_channels=16, image_dim=1280)

FLAVORS: dict[str, dict] = {
    "tiny": dict(num_layers=2, hidden_size=48, num_heads=2, ffn_size=64, in_channels=4, out_channels=4,
                 context_dim=16, freq_dim=32, text_len=16),
    "t2v_1_3b": dict(num_layers=30, hidden_size=1536, num_heads=12, ffn_size=8960),
    "t2v_14b": dict(_14B),
    "i2v_14b_480p": dict(_14B, **_I2V),
    "i2v_14b_720p": dict(_14B, **_I2V),
    "ti2v_5b": dict(num_layers=30, hidden_size=3072, num_heads=24, ffn_size=14336, in_channels=48, out_channels=48),
    "t2v_a14b": dict(_14B),
    "i2v_a14b": dict(_14B, in_channels=36, out_channels=16),
}
# (height, width) in pixels and the flow shift Wan samples with
SAMPLING: dict[str, dict] = {
    "tiny": dict(size=(32, 32), shift=5.0),
    "t2v_1_3b": dict(size=(480, 832), shift=5.0),
    "t2v_14b": dict(size=(720, 1280), shift=5.0),
    "i2v_14b_480p": dict(size=(480, 832), shift=3.0),
    "i2v_14b_720p": dict(size=(720, 1280), shift=5.0),
    "ti2v_5b": dict(size=(704, 1280), shift=5.0, fps=24.0, frames=121, guidance=5.0),
    "t2v_a14b": dict(size=(720, 1280), shift=12.0, boundary=0.875, guidance=4.0, guidance_2=3.0),
    "i2v_a14b": dict(size=(720, 1280), shift=5.0, boundary=0.9, guidance=3.5, guidance_2=3.5),
}
TWO_EXPERTS = ("t2v_a14b", "i2v_a14b")  # Wan 2.2 A14B: a high-noise and a low-noise network
FIRST_FRAME = ("ti2v_5b",)  # Wan 2.2 TI2V: image conditioning by a clean first latent frame


def _key(flavor: str) -> str:
    key = flavor.lower().replace("-", "_").replace(".", "_").removeprefix("wan2_1_").removeprefix("wan2_2_").removeprefix("wan_")
    if key not in FLAVORS:
        raise ValueError(f"unknown Wan flavor {flavor!r}; choose one of: {', '.join(FLAVORS)}")
    return key


def wan_config(flavor: str, **overrides) -> WanConfig:
    """Config for a named flavor with keyword overrides (e.g. ``pretrained="/path/to/Wan2.1-T2V-1.3B-Diffusers"``)."""
    return WanConfig(**{**FLAVORS[_key(flavor)], **overrides})


def flavor_of(cfg: WanConfig, two_experts: bool = False) -> str | None:
    """The published flavor whose architecture ``cfg`` has (the 480p I2V name for both I2V sizes; ``two_experts``:
    the Wan 2.2 A14B name of a 14B architecture), or None."""
    arch = {k: v for k, v in vars(cfg).items() if k not in ("pretrained", "expert")}
    for name, kw in FLAVORS.items():
        if (name in TWO_EXPERTS) != two_experts:
            continue
        if {k: v for k, v in vars(WanConfig(**kw)).items() if k not in ("pretrained", "expert")} == arch:
            return name
    return None


def wan_objective(flavor: str = "t2v_1_3b", **overrides):
    """Wan's objective: rectified flow with a velocity target ``n - x0`` at time input ``1000 t``, times
    drawn uniformly and shifted by the flavor's shift (``t' = s t / (1 + (s - 1) t)``); the sampler
    integrates the same shifted grid (``FlowMatching.sample``). Wan 2.2 TI2V: :class:`FirstFrameFlowMatching`
    (``overrides`` may set ``image_prob``); A14B with ``expert="high"|"low"``: :class:`ExpertFlowMatching` (times
    of that expert's range only)."""
    from nemo_vfm.diffusion.flow_matching import FlowMatching

    key = _key(flavor)
    kw = {"shift": SAMPLING[key]["shift"], "time_sampling": "uniform", **overrides}
    if key in FIRST_FRAME:
        from nemo_vfm.diffusion.first_frame import FirstFrameFlowMatching

        return FirstFrameFlowMatching(**{"patch_size": tuple(FLAVORS[key].get("patch_size", (1, 2, 2))), **kw})
    if key in TWO_EXPERTS and kw.get("expert") is not None:
        from nemo_vfm.diffusion.experts import ExpertFlowMatching

        return ExpertFlowMatching(**{"boundary": SAMPLING[key]["boundary"], **kw})
    kw.pop("expert", None)
    return FlowMatching(**kw)
