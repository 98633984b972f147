"""HunyuanVideo 1.5 sampling: ``hunyuan_objective``'s Euler sampler (FlowMatching on the shifted grid, CFG) gives the
latents of diffusers' HunyuanVideo15Pipeline (FlowMatchEulerDiscreteScheduler with the flavor's shift,
ClassifierFreeGuidance) for the same transformer weights, noise and text states, T2V and I2V."""

import pytest
import torch

from nemo_vfm.models.hunyuan import convert as C
from nemo_vfm.models.hunyuan.flavors import hunyuan_objective

diffusers = pytest.importorskip("diffusers")

STEPS, GUIDANCE = 4, 6.0


def tiny():
    from nemo_vfm.models.hunyuan.model import HunyuanVideoConfig

    return HunyuanVideoConfig(num_layers=2, hidden_size=32, num_heads=2, num_refiner_layers=1, in_channels=9,
                              out_channels=4, text_dim=24, glyph_dim=12, image_dim=20, rope_axes_dim=(4, 6, 6))


def tiny_vae(latent_channels=4):
    from diffusers import AutoencoderKLHunyuanVideo15

    torch.manual_seed(0)
    return AutoencoderKLHunyuanVideo15(latent_channels=latent_channels, block_out_channels=(8, 8, 8, 8, 8),
                                       layers_per_block=1).eval()


def pipeline(cls, cfg, state, **components):
    from diffusers import (
        ClassifierFreeGuidance,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Transformer3DModel,
    )

    transformer = HunyuanVideo15Transformer3DModel(**C.config_to_diffusers(cfg)).eval()
    transformer.load_state_dict(C.to_diffusers(state), strict=True)
    return cls(text_encoder=None, tokenizer=None, transformer=transformer, vae=tiny_vae(cfg.out_channels),
               scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), text_encoder_2=None, tokenizer_2=None,
               guider=ClassifierFreeGuidance(guidance_scale=GUIDANCE), **components)


def texts(cfg, g):
    pos, neg = torch.randn(1, 6, cfg.text_dim, generator=g), torch.randn(1, 6, cfg.text_dim, generator=g)
    mask, nmask = torch.ones(1, 6, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)
    mask[:, 4:] = 0
    nmask[:, 2:] = 0
    glyph, gmask = torch.zeros(1, 3, cfg.glyph_dim), torch.zeros(1, 3, dtype=torch.long)  # no quoted text
    return pos, mask, neg, nmask, glyph, gmask


def ours(cfg, state, shape, cond, uncond, seed):
    net = cfg.build("meta").to_empty(device="cpu")
    net.load_state_dict(state)
    with torch.no_grad():
        return hunyuan_objective("480p_t2v").sample(net.eval(), shape, cond, uncond, guidance=GUIDANCE,
                                                     num_steps=STEPS, generator=torch.Generator().manual_seed(seed))


def test_t2v_sampling_matches_the_diffusers_pipeline():
    from diffusers import HunyuanVideo15Pipeline

    cfg = tiny()
    torch.manual_seed(0)
    state = {k: v + 0.1 * torch.randn_like(v) for k, v in cfg.build().state_dict().items()}
    g = torch.Generator().manual_seed(1)
    pos, mask, neg, nmask, glyph, gmask = texts(cfg, g)
    shape = (1, cfg.out_channels, 2, 4, 6)
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    pipe = pipeline(HunyuanVideo15Pipeline, cfg, state)
    pipe.vision_num_semantic_tokens = 5
    want = pipe(prompt_embeds=pos, prompt_embeds_mask=mask, negative_prompt_embeds=neg,
                negative_prompt_embeds_mask=nmask, prompt_embeds_2=glyph, prompt_embeds_mask_2=gmask,
                negative_prompt_embeds_2=glyph, negative_prompt_embeds_mask_2=gmask, latents=noise.clone(),
                height=64, width=96, num_inference_steps=STEPS, output_type="latent", return_dict=False)[0]
    got = ours(cfg, state, shape, {"context": pos, "context_mask": mask.bool()},
               {"context": neg, "context_mask": nmask.bool()}, seed=7)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert (got - noise).abs().max() > 0.1  # it moved


def test_i2v_conditioning_matches_the_diffusers_pipeline():
    """I2V: the condition channels hold the image latent in frame 0 and a frame-0 mask, the SigLIP tokens join
    the conditioning sequence; the noisy latent's first frame is not replaced."""
    cfg = tiny()
    torch.manual_seed(0)
    state = {k: v + 0.1 * torch.randn_like(v) for k, v in cfg.build().state_dict().items()}
    g = torch.Generator().manual_seed(1)
    pos, mask, neg, nmask, glyph, gmask = texts(cfg, g)
    shape = (1, cfg.out_channels, 2, 4, 6)
    image_latent, image_embeds = torch.randn(1, 4, 1, 4, 6, generator=g), torch.randn(1, 5, cfg.image_dim, generator=g)
    cond_latents = torch.zeros(1, cfg.cond_channels, 2, 4, 6)
    cond_latents[:, :4, :1], cond_latents[:, 4, 0] = image_latent, 1.0
    # diffusers' I2V pipeline: the same loop with these inputs (its image/VAE encoders replaced by their outputs)
    from diffusers import HunyuanVideo15ImageToVideoPipeline

    pipe = pipeline(HunyuanVideo15ImageToVideoPipeline, cfg, state, image_encoder=None, feature_extractor=None)
    pipe.encode_image = lambda **kw: image_embeds
    pipe.prepare_cond_latents_and_mask = lambda **kw: (cond_latents[:, :4], cond_latents[:, 4:])
    pipe.video_processor.calculate_default_height_width = lambda **kw: (64, 96)
    pipe.video_processor.resize = lambda image, **kw: image
    import PIL.Image

    noise = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    want = pipe(image=PIL.Image.new("RGB", (96, 64)), prompt_embeds=pos, prompt_embeds_mask=mask,
                negative_prompt_embeds=neg, negative_prompt_embeds_mask=nmask, prompt_embeds_2=glyph,
                prompt_embeds_mask_2=gmask, negative_prompt_embeds_2=glyph, negative_prompt_embeds_mask_2=gmask,
                latents=noise.clone(), num_inference_steps=STEPS, output_type="latent", return_dict=False)[0]
    extra = {"cond_latents": cond_latents, "image_embeds": image_embeds}
    got = ours(cfg, state, shape, {"context": pos, "context_mask": mask.bool(), **extra},
               {"context": neg, "context_mask": nmask.bool(), **extra}, seed=7)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_the_vae_tokenizer_matches_the_pipelines_scaling(tmp_path):
    """``vfm prepare``'s tokenizer "hunyuanvideo1_5": a pipeline folder's vae/, latents ``z * scaling_factor``
    (the I2V pipeline's image latents), decode = the pipeline's ``vae.decode(z / scaling_factor)``."""
    from nemo_vfm.tokenizers.registry import build_tokenizer

    vae = tiny_vae()
    vae.save_pretrained(tmp_path / "vae")
    tok = build_tokenizer("hunyuanvideo1_5", path=str(tmp_path))
    assert (tok.temporal_compression, tok.spatial_compression, tok.latent_channels) == (4, 16, 4)
    video = torch.rand(1, 3, 5, 32, 32) * 2 - 1
    z = tok.encode(video)
    with torch.no_grad():
        want = vae.encode(video).latent_dist.mode() * vae.config.scaling_factor
        assert z.shape == (1, 4, 2, 2, 2) and (z - want).abs().max() <= 1e-5
        assert (tok.decode(z) - vae.decode(want / vae.config.scaling_factor).sample).abs().max() <= 1e-5


def test_vfm_generate_on_a_published_folder_says_what_is_missing(tmp_path):
    """A HunyuanVideo 1.5 pipeline folder: `vfm generate` / `vfm export` refuse it naming the missing text encoders
    (NotImplementedError, which the CLI prints and exits 2 on)."""
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.models.hunyuan.model import HunyuanVideoConfig

    cfg = HunyuanVideoConfig(num_layers=1, hidden_size=32, num_heads=2, num_refiner_layers=1, in_channels=9,
                             out_channels=4, text_dim=8, glyph_dim=8, glyph_hidden=8, image_dim=8)
    C.save_weights(cfg.build().state_dict(), tmp_path / "transformer", cfg)
    assert C.is_hunyuan_folder(tmp_path) and C.read_config(tmp_path) == cfg
    with pytest.raises(NotImplementedError, match="HunyuanVideo 1.5 folder.*Qwen2.5-VL / ByT5 text encoders"):
        read_checkpoint_info(tmp_path)
