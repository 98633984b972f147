"""Published LTX-2 sizes. ``ltx2_config("ltx2_19b")`` returns an :class:`LTX2Config`.

| flavor | layers | video heads x dim | audio heads x dim | latent channels (video / audio) | RoPE | gates, text adaLN |
|---|---|---|---|---|---|---|
| ltx2_19b | 48 | 32 x 128 (4096) | 32 x 64 (2048) | 128 / 8 x 16 mel bins | split, fp64 frequencies | no |
| tiny | 2 | 2 x 16 | 2 x 8 | 8 / 2 x 4 | split | no |

``ltx2_19b`` is the architecture of the LTX-2 release (``Lightricks/LTX-2``, dev and distilled checkpoints): the
values of diffusers' conversion script for it (``scripts/convert_ltx2_to_diffusers.py``: ``rope_type="split"``,
every other argument at ``LTX2VideoTransformer3DModel``'s defaults). Text: Gemma 3 12B states (3840 wide) through
the release's connectors, which are not part of this network. Sampling defaults are diffusers' ``LTX2Pipeline``'s
(512 x 768, 24 fps). LTX-2.3's options (gated attention, cross-attention adaLN, the caption projection moved into the
connectors: ``prompt_embeddings=False``) are built and match diffusers, but no LTX-2.3 flavor is offered: its
published sizes were not checked here (a diffusers folder's ``config.json`` gives them).
"""

from nemo_vfm.models.ltx2.model import LTX2Config

FLAVORS: dict[str, dict] = {
    "tiny": dict(num_layers=2, num_heads=2, head_dim=16, in_channels=8, out_channels=8, audio_num_heads=2,
                 audio_head_dim=8, audio_in_channels=8, audio_out_channels=8, audio_mel_bins=4, caption_channels=16,
                 rope_type="split"),
    "ltx2_19b": dict(rope_type="split"),
}
SAMPLING: dict[str, dict] = {
    "tiny": dict(size=(64, 64), fps=24.0),
    "ltx2_19b": dict(size=(512, 768), fps=24.0),
}


def _key(flavor: str) -> str:
    key = flavor.lower().replace("-", "_").replace(".", "_")
    if key not in FLAVORS:
        raise ValueError(f"unknown LTX-2 flavor {flavor!r}; choose one of: {', '.join(FLAVORS)}")
    return key


def ltx2_config(flavor: str, **overrides) -> LTX2Config:
    """Config for a named flavor with keyword overrides (e.g. ``pretrained="/path/to/LTX-2"``)."""
    return LTX2Config(**{**FLAVORS[_key(flavor)], **overrides})
