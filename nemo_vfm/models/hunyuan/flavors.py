"""Published HunyuanVideo 1.5 transformers. ``hunyuan_config("480p_t2v")`` returns a :class:`HunyuanVideoConfig`.

Every published transformer has one architecture (54 double blocks, hidden 2048, 16 heads of 128, MLP 8192,
2 refiner blocks, 65 input channels = 32 noisy latent + 32 condition latent + 1 mask, 32 out, patch 1x1x1;
Qwen2.5-VL text 3584, ByT5 glyph text 1472, SigLIP image 1152); the step-distilled 480p I2V model adds a second
time embedding (mean flow). T2V and I2V differ only in their inputs: I2V puts the first frame's VAE latent and a
frame-0 mask in the condition channels and adds the SigLIP image tokens. Sampling numbers are those of diffusers'
conversion script (``SCHEDULER_CONFIGS``, ``GUIDANCE_CONFIGS``, ``TRANSFORMER_CONFIGS``):

| flavor | conditioning | target size (px) | shift | guidance |
|---|---|---|---|---|
| 480p_t2v | text | 640 | 5.0 | 6.0 |
| 480p_i2v | text + first frame | 640 | 5.0 | 6.0 |
| 720p_t2v | text | 960 | 9.0 | 6.0 |
| 720p_i2v | text + first frame | 960 | 7.0 | 6.0 |
| 480p_t2v_distilled / 480p_i2v_distilled | as above, CFG-distilled | 640 | 5.0 | 1.0 |
| 720p_i2v_distilled | text + first frame, CFG-distilled | 960 | 7.0 | 1.0 |
| 480p_i2v_step_distilled | text + first frame, mean flow | 640 | 7.0 | 1.0 |
| tiny | tests | 32 | 5.0 | 6.0 |
"""

from __future__ import annotations

from nemo_vfm.models.hunyuan.model import HunyuanVideoConfig

_TINY = dict(num_layers=2, hidden_size=32, num_heads=2, num_refiner_layers=1, in_channels=9, out_channels=4,
             text_dim=16, glyph_dim=8, glyph_hidden=16, image_dim=12, rope_axes_dim=(4, 6, 6))
FLAVORS: dict[str, dict] = {
    "tiny": _TINY,
    "480p_t2v": {}, "480p_i2v": {}, "720p_t2v": {}, "720p_i2v": {},
    "480p_t2v_distilled": {}, "480p_i2v_distilled": {}, "720p_i2v_distilled": {},
    "480p_i2v_step_distilled": dict(use_meanflow=True),
}
SAMPLING: dict[str, dict] = {
    "tiny": dict(target_size=32, shift=5.0, guidance=6.0, i2v=False),
    "480p_t2v": dict(target_size=640, shift=5.0, guidance=6.0, i2v=False),
    "480p_i2v": dict(target_size=640, shift=5.0, guidance=6.0, i2v=True),
    "720p_t2v": dict(target_size=960, shift=9.0, guidance=6.0, i2v=False),
    "720p_i2v": dict(target_size=960, shift=7.0, guidance=6.0, i2v=True),
    "480p_t2v_distilled": dict(target_size=640, shift=5.0, guidance=1.0, i2v=False),
    "480p_i2v_distilled": dict(target_size=640, shift=5.0, guidance=1.0, i2v=True),
    "720p_i2v_distilled": dict(target_size=960, shift=7.0, guidance=1.0, i2v=True),
    "480p_i2v_step_distilled": dict(target_size=640, shift=7.0, guidance=1.0, i2v=True),
}
FPS = 24.0  # the release's frame rate (121 frames = 5 s)
FRAMES = 121


def _key(flavor: str) -> str:
    key = flavor.lower().replace("-", "_").replace(".", "_")
    for prefix in ("hunyuanvideo_1_5_", "hunyuan_video_1_5_", "hunyuanvideo1_5_", "1_5_"):
        key = key.removeprefix(prefix)
    if key not in FLAVORS:
        raise ValueError(f"unknown HunyuanVideo flavor {flavor!r}; choose one of: {', '.join(FLAVORS)}")
    return key


def hunyuan_config(flavor: str = "480p_t2v", **overrides) -> HunyuanVideoConfig:
    """Config for a named flavor with keyword overrides (e.g. ``pretrained="/path/to/HunyuanVideo-1.5-480p_t2v"``)."""
    return HunyuanVideoConfig(**{**FLAVORS[_key(flavor)], **overrides})


def hunyuan_objective(flavor: str = "480p_t2v", **overrides):
    """The release's objective: rectified flow ``x_t = (1 - t) x0 + t n`` with velocity target ``n - x0`` at time
    input ``1000 t``, times shifted by the flavor's shift (``t' = s t / (1 + (s - 1) t)``), sampled with the
    Euler steps of diffusers' ``FlowMatchEulerDiscreteScheduler`` over ``linspace(1, 0, steps + 1)[:-1]``
    shifted: the same as Wan's, so it is :class:`~nemo_vfm.diffusion.flow_matching.FlowMatching`."""
    from nemo_vfm.diffusion.flow_matching import FlowMatching

    kw = {"shift": SAMPLING[_key(flavor)]["shift"], "time_sampling": "uniform", **overrides}
    return FlowMatching(**kw)
