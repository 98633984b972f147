"""LTX-2: forward parity with diffusers' LTX2VideoTransformer3DModel (fp32, CPU) on tiny configs unlike the release
(odd widths and frames, patches, both RoPE pairings, gates and cross-attention adaLN, audio on and off, per-token
times), converters both ways and their folders, and errors that name the problem."""

import pytest
import torch

from nemo_vfm.models.ltx2 import convert as C
from nemo_vfm.models.ltx2.model import LTX2Config

diffusers = pytest.importorskip("diffusers")


def tiny(**kw) -> LTX2Config:
    base = dict(num_layers=2, num_heads=3, head_dim=10, in_channels=5, out_channels=5, audio_num_heads=2,
                audio_head_dim=6, audio_in_channels=6, audio_out_channels=6, audio_mel_bins=3, caption_channels=7)
    return LTX2Config(**{**base, **kw})


def randomized(cfg: LTX2Config, seed: int = 0):
    torch.manual_seed(seed)
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return net.eval()


def reference(cfg: LTX2Config, state: dict):
    from diffusers import LTX2VideoTransformer3DModel

    ref = LTX2VideoTransformer3DModel(**C.config_to_diffusers(cfg)).eval()
    missing, unexpected = ref.load_state_dict(C.to_diffusers(state), strict=True)
    assert not missing and not unexpected
    return ref


def inputs(cfg: LTX2Config, B=2, T=3, H=4, W=2, La=5, L=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    pt, p, _ = cfg.patch_size
    c = cfg.in_channels // (pt * p * p)
    x = torch.randn(B, c, T * pt, H * p, W * p, generator=g)
    audio = torch.randn(B, cfg.audio_in_channels // cfg.audio_mel_bins, La, cfg.audio_mel_bins, generator=g)
    t = torch.rand(B, generator=g)
    ctx = torch.randn(B, L, cfg.caption_channels, generator=g)
    actx = torch.randn(B, L, cfg.caption_channels, generator=g)
    mask = torch.ones(B, L)
    mask[0, 4:] = 0
    return x, audio, t, ctx, actx, mask


def diffusers_forward(ref, net, x, audio, t, ctx, actx, mask, fps=24.0, audio_t=None, isolate=False, **kw):
    """What LTX2Pipeline feeds the transformer: packed tokens, 1000 t, sigma = the time."""
    from diffusers import LTX2Pipeline

    pt, p, _ = net.cfg.patch_size
    grid = net.grid(*x.shape[2:])
    tokens = LTX2Pipeline._pack_latents(x, p, pt)
    a = audio.transpose(1, 2).flatten(2)
    at = None if audio_t is None else audio_t * 1000
    sig = kw.pop("sigma", t if t.dim() == 1 else None)
    out_v, out_a = ref(tokens, a, ctx, actx, t * 1000, audio_timestep=at,
                       sigma=None if sig is None else sig * 1000, encoder_attention_mask=mask,
                       audio_encoder_attention_mask=mask, num_frames=x.shape[2], height=x.shape[3], width=x.shape[4], fps=fps,
                       audio_num_frames=audio.shape[2], isolate_modalities=isolate, return_dict=False, **kw)
    return net.unpack(out_v, grid), out_a.unflatten(-1, (-1, net.cfg.audio_mel_bins)).transpose(1, 2)


CASES = {
    "release_like": {},
    "split_rope_patch": dict(rope_type="split", audio_num_heads=3, patch_size=(1, 2, 2), in_channels=8, out_channels=8),
    "gated_cross_mod": dict(gated_attn=True, audio_gated_attn=True, cross_attn_mod=True, audio_cross_attn_mod=True,
                            ff_bias=False),
    "cross_mod_static_cross_time": dict(cross_attn_mod=True, prompt_adaln_single=False, cross_timestep=True),
    "ltx2_3_text_path": dict(gated_attn=True, audio_gated_attn=True, cross_attn_mod=True, audio_cross_attn_mod=True,
                             prompt_embeddings=False, caption_channels=30, rope_type="split", audio_num_heads=3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_diffusers_with_audio(case):
    cfg = tiny(**CASES[case])
    net = randomized(cfg)
    ref = reference(cfg, net.state_dict())
    x, audio, t, ctx, actx, mask = inputs(cfg)
    if not cfg.prompt_embeddings:  # the connectors' projected text: each stream's width
        actx = actx[..., : cfg.audio_hidden_size]
    ta = torch.tensor([0.3, 0.8])
    kw = dict(sigma=t, audio_sigma=ta) if cfg.cross_timestep else {}
    with torch.no_grad():
        v, a = net(x, t, ctx, mask, audio=audio, audio_timesteps=ta, audio_context=actx, audio_context_mask=mask,
                   fps=25.0, **kw)
        rv, ra = diffusers_forward(ref, net, x, audio, t, ctx, actx, mask, fps=25.0, audio_t=ta,
                                   use_cross_timestep=cfg.cross_timestep, audio_sigma=ta * 1000)
    assert v.shape == x.shape and a.shape == audio.shape
    torch.testing.assert_close(v, rv, rtol=0, atol=1e-5)
    torch.testing.assert_close(a, ra, rtol=0, atol=1e-5)


def test_video_only_matches_isolated_modalities_and_ignores_audio_weights():
    cfg = tiny(gated_attn=True)
    net = randomized(cfg)
    ref = reference(cfg, net.state_dict())
    x, audio, t, ctx, actx, mask = inputs(cfg, T=2, H=3, W=5)
    with torch.no_grad():
        v = net(x, t, ctx, mask)
        rv, _ = diffusers_forward(ref, net, x, audio, t, ctx, actx, mask, isolate=True)
    torch.testing.assert_close(v, rv, rtol=0, atol=1e-5)


def test_per_token_video_times_match_diffusers():
    cfg = tiny()
    net = randomized(cfg)
    ref = reference(cfg, net.state_dict())
    x, audio, t, ctx, actx, mask = inputs(cfg, T=2)
    S = 2 * 4 * 2
    tv = torch.rand(2, S)
    tv[:, :8] = 0.0  # a clean first frame
    ta = torch.tensor([0.4, 0.6])
    with torch.no_grad():
        v, a = net(x, tv, ctx, mask, audio=audio, audio_timesteps=ta, audio_context=actx, audio_context_mask=mask)
        rv, ra = diffusers_forward(ref, net, x, audio, tv, ctx, actx, mask, audio_t=ta)
    torch.testing.assert_close(v, rv, rtol=0, atol=1e-5)
    torch.testing.assert_close(a, ra, rtol=0, atol=1e-5)


def test_per_sample_fps_matches_diffusers_per_sample():
    cfg = tiny()
    net = randomized(cfg)
    ref = reference(cfg, net.state_dict())
    x, audio, t, ctx, actx, mask = inputs(cfg)
    with torch.no_grad():
        v, a = net(x, t, ctx, mask, audio=audio, audio_context=actx, audio_context_mask=mask,
                   fps=torch.tensor([24.0, 30.0]))
        for i, fps in enumerate((24.0, 30.0)):
            rv, ra = diffusers_forward(ref, net, x[i:i + 1], audio[i:i + 1], t[i:i + 1], ctx[i:i + 1], actx[i:i + 1],
                                       mask[i:i + 1], fps=fps)
            torch.testing.assert_close(v[i:i + 1], rv, rtol=0, atol=1e-5)
            torch.testing.assert_close(a[i:i + 1], ra, rtol=0, atol=1e-5)


def test_input_errors_name_the_fix():
    cfg = tiny()
    net = cfg.build()
    x, audio, t, ctx, actx, mask = inputs(cfg)
    with pytest.raises(ValueError, match="audio_context"):
        net(x, t, ctx, mask, audio=audio)
    with pytest.raises(ValueError, match="audio_in_channels"):
        net(x, t, ctx, mask, audio=audio[:, :, :, :2], audio_context=actx)
    with pytest.raises(ValueError, match="per-token timesteps"):
        net(x, torch.rand(2, 5), ctx, mask)


@pytest.mark.parametrize("downscale", [1, 2])
def test_ic_lora_reference_tokens_match_diffusers(downscale):
    """IC-LoRA: reference latents appended clean (time 0) with the positions LTX2ICLoraPipeline gives them."""
    from diffusers import LTX2Pipeline

    cfg = tiny(reference_downscale=downscale, rope_type="split", audio_num_heads=3)
    net = randomized(cfg)
    ref = reference(cfg, net.state_dict())
    x, audio, t, ctx, actx, mask = inputs(cfg, T=2, H=4, W=2)
    g = torch.Generator().manual_seed(7)
    refx = torch.randn(2, x.shape[1], 3, 4 // downscale, 2 // downscale, generator=g)
    ta = torch.tensor([0.2, 0.9])
    with torch.no_grad():
        v, a = net(x, t, ctx, mask, audio=audio, audio_timesteps=ta, audio_context=actx, audio_context_mask=mask,
                   reference_latents=refx)
        S, Sr = 2 * 4 * 2, 3 * (4 // downscale) * (2 // downscale)
        coords = ref.rope.prepare_video_coords(2, 2, 4, 2, x.device, fps=24.0)
        rcoords = ref.rope.prepare_video_coords(2, 3, 4 // downscale, 2 // downscale, x.device, fps=24.0)
        rcoords[:, 1:] *= downscale
        tokens = torch.cat([LTX2Pipeline._pack_latents(x), LTX2Pipeline._pack_latents(refx)], 1)
        tt = torch.cat([t[:, None].expand(-1, S), torch.zeros(2, Sr)], 1)
        rv, ra = ref(tokens, audio.transpose(1, 2).flatten(2), ctx, actx, tt * 1000, audio_timestep=ta * 1000,
                     sigma=t * 1000, audio_sigma=ta * 1000, encoder_attention_mask=mask,
                     audio_encoder_attention_mask=mask, audio_num_frames=audio.shape[2],
                     video_coords=torch.cat([coords, rcoords], 2), return_dict=False)
    assert v.shape == x.shape
    torch.testing.assert_close(v, net.unpack(rv[:, :S], (2, 4, 2)), rtol=0, atol=1e-5)
    torch.testing.assert_close(a, ra.unflatten(-1, (-1, cfg.audio_mel_bins)).transpose(1, 2), rtol=0, atol=1e-5)


@pytest.mark.parametrize("case", ["release_like", "gated_cross_mod"])
def test_guidance_passes_match_diffusers(case):
    """LTX2Pipeline's extra guidance passes: STG (values in place of self-attention at some blocks, all samples or
    those a perturbation mask picks; diffusers' perturbed_attn=True) and modality isolation (no audio <-> video
    attention)."""
    from diffusers import LTX2VideoTransformer3DModel

    cfg = tiny(**CASES[case])
    net = randomized(cfg)
    ref = LTX2VideoTransformer3DModel(**C.config_to_diffusers(cfg), perturbed_attn=True).eval()
    ref.load_state_dict(C.to_diffusers(net.state_dict()), strict=True)
    x, audio, t, ctx, actx, mask = inputs(cfg)
    passes = [dict(stg=[1]), dict(stg=[0, 1], pm=torch.tensor([1.0, 0.0])), dict(isolate=True)]
    with torch.no_grad():
        plain = net(x, t, ctx, mask, audio=audio, audio_context=actx, audio_context_mask=mask)
        for p in passes:
            pm = p.get("pm")
            v, a = net(x, t, ctx, mask, audio=audio, audio_context=actx, audio_context_mask=mask,
                       stg_blocks=p.get("stg", ()), perturbation_mask=pm, isolate_modalities=p.get("isolate", False))
            rv, ra = diffusers_forward(ref, net, x, audio, t, ctx, actx, mask, isolate=p.get("isolate", False),
                                       spatio_temporal_guidance_blocks=p.get("stg"), perturbation_mask=pm)
            torch.testing.assert_close(v, rv, rtol=0, atol=1e-5)
            torch.testing.assert_close(a, ra, rtol=0, atol=1e-5)
            assert (v - plain[0]).abs().max() > 1e-3  # the pass changes the prediction
            if pm is not None:  # sample 0 is not perturbed
                torch.testing.assert_close(v[0], plain[0][0], rtol=0, atol=1e-5)
