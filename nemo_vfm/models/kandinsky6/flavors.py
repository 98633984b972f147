"""Kandinsky 6 Video sizes. ``kandinsky6_config("lite_3b")`` returns a :class:`Kandinsky6Config`.

The release (Kandinsky 6.0 Video Lite, 3B parameters; Pro, 29B) publishes each network's sizes in its
``transformer/config.json``, which nemo-vfm did not have when these flavors were written: **the sizes below are
derived, not the published configs.** ``lite_3b`` takes Kandinsky 5 Video Lite's video stream (1792 wide, FFN 7168,
32 fused blocks, 2 text blocks, RoPE axes (16, 24, 24), time 512) and a narrower audio stream (1024, FFN 4096) chosen
so that the network has about 3B parameters (3.38B); ``pro_29b`` is diffusers' default video stream (4096, FFN 16384,
60 blocks, 4 text blocks, axes (32, 48, 48), time 1024; with the audio stream as wide as the video one it would be
48.2B) with a 2048-wide audio stream (30.4B). Both set the switches the released configs set (``ca_rope``,
``cross_gates``, ``fix_modulation``, ``text_token_padding``, 2 token types for image conditioning). With a
``pretrained`` folder, :func:`kandinsky6_config` reads the folder's ``config.json`` instead, so the published
network is what is built.

| flavor | fused blocks | video width / FFN | audio width / FFN | heads (Dh) | params |
|---|---|---|---|---|---|
| lite_3b (derived) | 32 | 1792 / 7168 | 1024 / 4096 | 28 (64) | 3.38B |
| pro_29b (derived) | 60 | 4096 / 16384 | 2048 / 8192 | 32 (128) | 30.4B |
| tiny | 2 | 48 / 64 | 32 / 40 | 3 (16) | tests |

Text: Qwen2.5-VL-7B final hidden states (3584 wide; the pipeline crops the 129-token chat template and keeps up to
1024 prompt tokens) and CLIP ViT-L/14's pooled output (768). Video latents: HunyuanVideo's VAE (16 channels, 4x8x8);
audio latents: MMAudio's VAE (20 channels, 1024-sample hop at 44.1 kHz).
"""

from nemo_vfm.models.kandinsky6.model import Kandinsky6Config

_RELEASE = dict(ca_rope=True, cross_gates=True, fix_modulation=True, text_token_padding=True, num_token_types=2)
FLAVORS: dict[str, dict] = {
    "tiny": dict(_RELEASE, num_layers=2, num_text_layers=1, hidden_size=48, ffn_size=64, time_dim=24,
                 axes_dims=(4, 6, 6), audio_hidden_size=32, audio_ffn_size=40, in_channels=4, out_channels=4,
                 context_dim=16, pooled_dim=8, audio_channels=6, audio_out_channels=6),
    "lite_3b": dict(_RELEASE, num_layers=32, num_text_layers=2, hidden_size=1792, ffn_size=7168, time_dim=512,
                    axes_dims=(16, 24, 24), audio_hidden_size=1024, audio_ffn_size=4096),
    "pro_29b": dict(_RELEASE, num_layers=60, num_text_layers=4, hidden_size=4096, ffn_size=16384, time_dim=1024,
                    axes_dims=(32, 48, 48), audio_hidden_size=2048, audio_ffn_size=8192),
}
# the pipeline's defaults (Kandinsky6TI2VAPipeline.__call__): size, frames, fps, steps, guidance. The flow shift is
# the scheduler's (read from a pipeline folder's scheduler/scheduler_config.json; 1.0 here when there is none)
SAMPLING: dict[str, dict] = {
    name: dict(size=(512, 768), frames=121, fps=24.0, num_steps=50, guidance=5.0, shift=1.0) for name in FLAVORS
}
SAMPLING["tiny"] = dict(size=(32, 32), frames=5, fps=24.0, num_steps=4, guidance=5.0, shift=1.0)


def _key(flavor: str) -> str:
    key = flavor.lower().replace("-", "_").replace(".", "_").removeprefix("kandinsky6_")
    if key not in FLAVORS:
        raise ValueError(f"unknown Kandinsky 6 flavor {flavor!r}; choose one of: {', '.join(FLAVORS)}")
    return key


def kandinsky6_config(flavor: str = "lite_3b", pretrained: str | None = None, **overrides) -> Kandinsky6Config:
    """A flavor's config with keyword overrides; with ``pretrained`` (a transformer or pipeline folder), that folder's
    own ``config.json`` (plus ``overrides``) instead of the flavor's sizes."""
    if pretrained:
        from nemo_vfm.models.kandinsky6.convert import read_config

        return read_config(pretrained, pretrained=pretrained, **overrides)
    return Kandinsky6Config(**{**FLAVORS[_key(flavor)], **overrides})


def kandinsky6_objective(flavor: str = "lite_3b", **overrides):
    """Rectified flow with a velocity target ``n - x0``, times drawn uniformly and shifted by the flavor's shift;
    sampled on diffusers' FlowMatchEulerDiscreteScheduler grid (``euler_grid="diffusers"``), as the pipeline."""
    from nemo_vfm.diffusion.flow_matching import FlowMatching

    return FlowMatching(**{"shift": SAMPLING[_key(flavor)]["shift"], "time_sampling": "uniform",
                           "euler_grid": "diffusers", **overrides})
