"""Cosmos-Predict2.5's Text2World / Video2World conditioning (nemo_vfm.diffusion.conditioning_frames): a few
sampling steps equal diffusers' Cosmos2_5_PredictBasePipeline on a tiny saved pipeline folder (Text2World and
Video2World with 2 clean latent frames, with guidance), the scheduler's sigmas, and the training draw (clean
frames, their times, the loss mask)."""

import pytest
import torch

from nemo_vfm.diffusion.conditioning_frames import ConditioningFramesFlowMatching, karras_flow_sigmas
from nemo_vfm.models.cosmos import convert as C
from nemo_vfm.models.cosmos.flavors import FLAVORS
from nemo_vfm.models.cosmos.model import CosmosConfig

diffusers = pytest.importorskip("diffusers")
from test_cosmos import nearest_resize_shim  # noqa: E402  (torchvision stand-in for diffusers' Cosmos model)

nearest_resize_shim()


class _NoSafetyChecker:
    """Stands in for cosmos_guardrail (not installed); the pipeline only moves it when prompts are embeddings."""

    def to(self, *a, **k):
        return self


def _scheduler():
    return diffusers.UniPCMultistepScheduler(use_karras_sigmas=True, use_flow_sigmas=True,
                                             prediction_type="flow_prediction", sigma_max=200.0, sigma_min=0.01)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("cosmos_pipe")
    torch.manual_seed(0)
    cfg = CosmosConfig(**FLAVORS["tiny"])
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    C.save_weights(net.state_dict(), root / "transformer", cfg)
    diffusers.AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                               temperal_downsample=[False, True, True], latents_mean=[0.1, 0.2, 0.3, 0.4],
                               latents_std=[2.0, 2.0, 3.0, 3.0]).save_pretrained(str(root / "vae"))
    _scheduler().save_pretrained(str(root / "scheduler"))
    return root


def _pipe(folder):
    from diffusers.pipelines.cosmos.pipeline_cosmos2_5_predict import Cosmos2_5_PredictBasePipeline

    return Cosmos2_5_PredictBasePipeline(
        text_encoder=None, tokenizer=None, safety_checker=_NoSafetyChecker(), scheduler=_scheduler(),
        transformer=diffusers.CosmosTransformer3DModel.from_pretrained(str(folder / "transformer")),
        vae=diffusers.AutoencoderKLWan.from_pretrained(str(folder / "vae")))


def test_karras_flow_sigmas_are_the_pipeline_schedulers():
    s = _scheduler()
    s.set_timesteps(7)
    torch.testing.assert_close(karras_flow_sigmas(7), s.sigmas.float(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["text2world", "video2world"])
def test_sampling_matches_the_diffusers_pipeline(folder, mode):
    pipe = _pipe(folder)
    net = C.load_pretrained(folder).eval()
    g = torch.Generator().manual_seed(1)
    frames, H, W, steps = 9, 32, 32, 4
    noise = torch.randn(1, 4, 3, H // 8, W // 8, generator=g)
    ctx, neg = torch.randn(1, 6, 32, generator=g), torch.randn(1, 6, 32, generator=g)
    cond, kw = {"context": ctx}, {}
    if mode == "video2world":
        video = torch.rand(1, 3, 5, H, W, generator=g) * 2 - 1  # 5 pixel frames -> 2 latent frames
        kw["video"] = video
        padded = torch.cat([video, video[:, :, -1:].repeat(1, 1, frames - 5, 1, 1)], dim=2)
        # the `vfm prepare` tokenizer of the family (the Wan 2.1 VAE) reads the pipeline folder's vae/
        from nemo_vfm.tokenizers.registry import build_tokenizer

        with torch.no_grad():
            cond["cond_frames"] = build_tokenizer("wan", path=str(folder)).encode(padded)[:, :, :2]
    ref = pipe(prompt_embeds=ctx, negative_prompt_embeds=neg, height=H, width=W, num_frames=frames,
               num_inference_steps=steps, guidance_scale=3.0, latents=noise.clone(), output_type="latent",
               num_latent_conditional_frames=2, **kw).frames
    obj = ConditioningFramesFlowMatching()
    with torch.no_grad():
        ours = obj.sample(net, noise.shape, cond, {"context": neg}, guidance=3.0, num_steps=steps, noise=noise.clone())
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max() <= 1e-4 * ref.abs().max()
    if mode == "video2world":
        # the clean frames travel the straight line from the noise to cond_frames (not written back, as diffusers)
        assert (ours[:, :, :2] - cond["cond_frames"]).abs().max() <= 0.1 * cond["cond_frames"].abs().max()


def test_training_draw_keeps_clean_frames_and_skips_them_in_the_loss():
    obj = ConditioningFramesFlowMatching(frame_probs=(0.0, 0.0, 1.0))  # always 2 clean frames
    x0 = torch.randn(3, 4, 3, 4, 4)
    inp = obj.training_input(x0, torch.Generator().manual_seed(0))
    assert torch.equal(inp.x[:, :, :2], x0[:, :, :2]) and not torch.equal(inp.x[:, :, 2], x0[:, :, 2])
    assert inp.timesteps.shape == (3, 12)
    assert torch.all(inp.timesteps[:, :8] == 1e-4) and torch.allclose(inp.timesteps[:, 8:], inp.level[:, None].expand(3, 4))
    out = torch.randn_like(x0)
    loss, _ = obj.loss_from_output(out, inp)
    want = ((out[:, :, 2:] - (inp.noise - x0)[:, :, 2:]) ** 2).mean()
    torch.testing.assert_close(loss, want)
    seen = {}

    def net(x, t, **kw):
        seen.update(kw)
        return out

    obj.training_loss(net, x0, {"context": torch.zeros(3, 2, 8)}, generator=torch.Generator().manual_seed(0))
    assert seen["cond_mask"].shape == (3, 1, 3, 4, 4) and seen["cond_mask"][:, :, :2].eq(1).all()
    t2w = ConditioningFramesFlowMatching(frame_probs=(1.0,)).training_input(x0, torch.Generator().manual_seed(0))
    assert t2w.cond_mask.sum() == 0 and torch.equal(t2w.x, t2w.x_t)
    with pytest.raises(ValueError, match="frame_probs"):
        ConditioningFramesFlowMatching(frame_probs=(0.5, 0.2))
    with pytest.raises(ValueError, match="sampler='unipc'"):
        obj.sample(net, x0.shape, {}, sampler="euler")


def test_the_inference_engines_loop_samples_text2world_as_the_objective(folder):
    """``vfm generate`` / training previews run ``inference.sampling.solve`` with the generic guidance
    ``u + g (c - u)``: with ``g = 1 +`` the pipeline's scale it is the objective's (= diffusers') Text2World."""
    from nemo_vfm.inference.sampling import guided_predictor, predictor, solve

    net = C.load_pretrained(folder).eval()
    g = torch.Generator().manual_seed(2)
    noise = torch.randn(1, 4, 3, 4, 4, generator=g)
    ctx, neg = torch.randn(1, 6, 32, generator=g), torch.randn(1, 6, 32, generator=g)
    obj = ConditioningFramesFlowMatching()
    fn = guided_predictor(predictor(obj, net), {"context": ctx}, {"context": neg}, 1.0 + 3.0)
    with torch.no_grad():
        got = solve(obj, fn, noise.clone(), "unipc", 4)
        want = obj.sample(net, noise.shape, {"context": ctx}, {"context": neg}, guidance=3.0, num_steps=4,
                          noise=noise.clone())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
