"""Wan 2.2 sampling from tiny random pipeline folders written here, step by step against diffusers: TI2V (one
network, the Wan 2.2 VAE; text-to-video and from an image's clean first frame) against ``WanPipeline`` /
``WanImageToVideoPipeline`` with ``expand_timesteps=True``, and A14B (two experts switched at the boundary, each
with its own guidance) against ``WanPipeline(transformer_2=..., boundary_ratio=...)``; and ``vfm generate``."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from nemo_vfm.cli.main import main
from nemo_vfm.io.video import read_video

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

WORDS = "a red green blue circle square moving left right on background black"
PROMPT = "a red circle moving left"


def _tokenizer(folder):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.normalizer, tk.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tk.train_from_iterator([WORDS], trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"]))
    tk.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(str(folder))


def _net(cfg, seed):
    torch.manual_seed(seed)
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return net


def _pipeline(root, ti2v: bool):
    from nemo_vfm.models.wan.convert import save_weights
    from nemo_vfm.models.wan.model import WanConfig

    cfg = WanConfig(num_layers=2, hidden_size=24, num_heads=2, ffn_size=32, in_channels=4, out_channels=4,
                    context_dim=16, freq_dim=16)
    torch.manual_seed(0)
    if ti2v:  # one network; the Wan 2.2 VAE (residual, 2x2 patches: 4x16x16)
        save_weights(_net(cfg, 0).state_dict(), root / "transformer", cfg)
        vae = diffusers.AutoencoderKLWan(base_dim=8, decoder_base_dim=12, z_dim=4, dim_mult=[1, 2, 2, 2],
                                         num_res_blocks=1, is_residual=True, in_channels=12, out_channels=12,
                                         patch_size=2, scale_factor_spatial=16, latents_mean=[0.1, 0.2, 0.3, 0.4],
                                         latents_std=[2.0, 2.0, 3.0, 3.0])
        index = {"_class_name": "WanPipeline", "expand_timesteps": True}
    else:  # two experts (transformer/: high noise, transformer_2/: low noise); the Wan 2.1 VAE
        for seed, expert in enumerate(("high", "low")):
            save_weights(_net(cfg, seed + 1).state_dict(), root, dataclasses.replace(cfg, expert=expert))
        vae = diffusers.AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                         latents_mean=[0.1, 0.2, 0.3, 0.4], latents_std=[2.0, 2.0, 3.0, 3.0])
        index = {"_class_name": "WanPipeline", "boundary_ratio": 0.875}
    vae.save_pretrained(str(root / "vae"))
    (root / "model_index.json").write_text(json.dumps(index))
    transformers.UMT5EncoderModel(transformers.UMT5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                                          num_heads=4)).save_pretrained(str(root / "text_encoder"))
    _tokenizer(root / "tokenizer")
    return root


@pytest.fixture(scope="module")
def ti2v(tmp_path_factory):
    from PIL import Image

    root = _pipeline(tmp_path_factory.mktemp("wan22_ti2v"), True)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(root / "first.png")
    return root


@pytest.fixture(scope="module")
def a14b(tmp_path_factory):
    return _pipeline(tmp_path_factory.mktemp("wan22_a14b"), False)


def _record(module, calls, tag, ours: bool):
    def hook(mod, args, kwargs, out):
        if ours:
            x, t = args[0], args[1]
        else:
            x, t, out = kwargs["hidden_states"], kwargs["timestep"], out[0]
        calls.append((tag, x.detach().clone(), t.detach().float().clone(), out.detach().clone()))

    return module.register_forward_hook(hook, with_kwargs=True)


def _diffusers_parts(root, shift):
    return dict(tokenizer=transformers.AutoTokenizer.from_pretrained(str(root / "tokenizer")),
                text_encoder=transformers.UMT5EncoderModel.from_pretrained(str(root / "text_encoder")),
                vae=diffusers.AutoencoderKLWan.from_pretrained(str(root / "vae")),
                scheduler=diffusers.UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                            flow_shift=shift, num_train_timesteps=1000))


def _compare(ours, theirs, per_token: bool | None):
    """Our batched CFG call (cond; uncond) per step against diffusers' two calls per step."""
    assert len(theirs) == 2 * len(ours) and len(ours) > 0
    for i, (tag, x, t, out) in enumerate(ours):
        for half in (0, 1):
            rtag, rx, rt, rout = theirs[2 * i + half]
            assert tag == rtag, (i, tag, rtag)
            assert (x[half: half + 1] - rx).abs().max() <= 1e-5, i
            tt = t[half: half + 1] * 1000
            assert (tt.expand_as(rt) - rt).abs().max() <= 1e-3, i  # diffusers' integer timesteps
            if per_token is not None:
                assert (rt.dim() == 2) and (t.dim() == 2) == per_token
            assert (out[half: half + 1] - rout).abs().max() <= 1e-5, i


@pytest.mark.parametrize("with_image", [False, True], ids=["t2v", "ti2v"])
def test_ti2v_sampling_matches_diffusers_step_by_step(ti2v, with_image, monkeypatch):
    from nemo_vfm.diffusion.first_frame import FirstFrameFlowMatching
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.sampling import initial_noise
    from nemo_vfm.inference.wan import generate_wan22, image_conditions, load_image

    info = read_checkpoint_info(ti2v)
    assert isinstance(info.objective, FirstFrameFlowMatching) and info.generation["tokenizer"]["name"] == "wan2_2"
    assert info.generation["fps"] == 24.0 and info.generation["latent_shape"] == [4, 31, 44, 80]
    engine = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32", cache_text_kv=False)
    steps, shape, seed = 4, (4, 2, 2, 2), 3
    extra = image_conditions(info, engine.tokenizer, ti2v / "first.png", 1, 5, 32, 32) if with_image else None
    ours = []
    handle = _record(engine.net, ours, "transformer", True)
    generate_wan22(engine, [PROMPT], shape, SamplingConfig(sampler="unipc", num_steps=steps, guidance=5.0, seed=seed),
                   extra)
    handle.remove()
    parts = _diffusers_parts(ti2v, info.objective.shift)
    transformer = diffusers.WanTransformer3DModel.from_pretrained(str(ti2v / "transformer")).eval()
    theirs = []
    _record(transformer, theirs, "transformer", False)
    kw = dict(prompt=PROMPT, negative_prompt="", num_frames=5, height=32, width=32, num_inference_steps=steps,
              guidance_scale=5.0, latents=initial_noise((1, *shape), seed), output_type="latent")
    if with_image:
        from diffusers.pipelines.wan import pipeline_wan, pipeline_wan_i2v

        monkeypatch.setattr(pipeline_wan_i2v, "prompt_clean", pipeline_wan.prompt_clean)  # no ftfy installed here
        pipe = diffusers.WanImageToVideoPipeline(transformer=transformer, expand_timesteps=True, image_encoder=None,
                                                 image_processor=None, **parts)
        ref = pipe(image=load_image(ti2v / "first.png", 32, 32)[None], **kw).frames
    else:
        ref = diffusers.WanPipeline(transformer=transformer, expand_timesteps=True, **parts)(**kw).frames
    _compare(ours, theirs, per_token=with_image)
    assert (engine.last_latents - ref).abs().max() <= 1e-5
    if with_image:  # the clean first frame is the image's latent, kept to the end
        assert torch.equal(engine.last_latents[:, :, :1], extra["first_frame"])


def test_a14b_switches_experts_at_the_boundary_like_diffusers(a14b):
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.sampling import initial_noise
    from nemo_vfm.inference.wan import denoise_two_experts, low_noise_engine

    info = read_checkpoint_info(a14b)
    assert info.generation["experts"] == {"boundary": 0.875} and info.objective.shift == 12.0
    assert info.model_config.expert == "high"
    high = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32")
    low = low_noise_engine(info, high)
    assert low.text_encoder is high.text_encoder and low.net.cfg.expert == "low"
    steps, shape, seed = 6, (4, 2, 4, 4), 5
    ours = []
    hs = [_record(high.net, ours, "transformer", True), _record(low.net, ours, "transformer_2", True)]
    cond, uncond = high.encode_text([PROMPT])
    sampling = SamplingConfig(sampler="unipc", num_steps=steps, guidance=4.0, seed=seed)
    latents = denoise_two_experts(high, low, cond, uncond, shape, sampling, 2.0, 0.875)
    for h in hs:
        h.remove()
    assert {c[0] for c in ours} == {"transformer", "transformer_2"}  # both experts ran
    parts = _diffusers_parts(a14b, 12.0)
    t1 = diffusers.WanTransformer3DModel.from_pretrained(str(a14b / "transformer")).eval()
    t2 = diffusers.WanTransformer3DModel.from_pretrained(str(a14b / "transformer_2")).eval()
    theirs = []
    _record(t1, theirs, "transformer", False)
    _record(t2, theirs, "transformer_2", False)
    pipe = diffusers.WanPipeline(transformer=t1, transformer_2=t2, boundary_ratio=0.875, **parts)
    ref = pipe(prompt=PROMPT, negative_prompt="", num_frames=5, height=32, width=32, num_inference_steps=steps,
               guidance_scale=4.0, guidance_scale_2=2.0, latents=initial_noise((1, *shape), seed),
               output_type="latent").frames
    _compare(ours, theirs, per_token=None)
    assert (latents - ref).abs().max() <= 1e-5


def test_vfm_generate_on_wan22_folders(ti2v, a14b, tmp_path, capsys):
    size = ["--frames", "5", "--height", "32", "--width", "32", "--device", "cpu", "--steps", "2"]
    assert main(["generate", "--ckpt", str(ti2v), "--prompt", PROMPT, "--image", str(ti2v / "first.png"),
                 "--out", str(tmp_path / "ti2v"), *size]) == 0, capsys.readouterr().err
    frames, fps = read_video(tmp_path / "ti2v" / "batch000.mp4")
    assert frames.shape[0] == 5 and fps == 24.0
    assert main(["generate", "--ckpt", str(a14b), "--prompt", PROMPT, "--guidance-2", "3", "--out",
                 str(tmp_path / "a14b"), *size]) == 0, capsys.readouterr().err
    assert read_video(tmp_path / "a14b" / "batch000.mp4")[0].shape[0] == 5
    assert main(["generate", "--ckpt", str(ti2v), "--prompt", "x", "--guidance-2", "3", *size]) == 2
    assert "--guidance-2 is the low-noise expert" in capsys.readouterr().err
    assert main(["generate", "--ckpt", str(a14b), "--prompt", "x", "--image", str(ti2v / "first.png"), *size]) == 2
    assert "--image is for image-to-video" in capsys.readouterr().err
