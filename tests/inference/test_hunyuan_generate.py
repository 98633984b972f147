"""HunyuanVideo 1.5 sampling: ``hunyuan_objective``'s Euler sampler (FlowMatching on the shifted grid, CFG) gives the
latents of diffusers' HunyuanVideo15Pipeline (FlowMatchEulerDiscreteScheduler with the flavor's shift,
ClassifierFreeGuidance) for the same transformer weights, noise and text states, T2V and I2V; and ``vfm generate``
on tiny random T2V and I2V pipeline folders (Qwen2.5-VL + ByT5 text encoders, SigLIP, written here) encodes prompts
as the pipeline does (bitwise), samples the pipelines' latents from prompts (and an image) alone, writes mp4s, and
gives the one-process latents with CFG-parallel or all-to-all CP2 on two gloo processes (``vfm generate --cp 2``
too)."""

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


# -- vfm generate on a tiny pipeline folder -------------------------------------------------------------------
WORDS = "a red robot holds sign that says hello walks in snow"
# 13 filler words make the system turn 108 tokens long, as the release's template is under Qwen's tokenizer (its crop)
CHAT = ("{{ 'begin ' * 13 }}{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")
PROMPT = 'a red robot holds a sign that says "HELLO"'


def _qwen_tokenizer(folder):
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.normalizer, tk.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tk.train_from_iterator([WORDS + " system user assistant"], trainers.WordLevelTrainer(
        special_tokens=["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>",
                                         chat_template=CHAT).save_pretrained(str(folder))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A HunyuanVideo15Pipeline folder at tiny sizes (Qwen hidden 16 = text_dim, ByT5 d_model 12 = glyph_dim)."""
    import transformers
    from diffusers import (
        ClassifierFreeGuidance,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )

    root = tmp_path_factory.mktemp("hunyuan_pipe")
    cfg = tiny()
    cfg.text_dim = 16
    torch.manual_seed(0)
    state = {k: v + 0.1 * torch.randn_like(v) for k, v in cfg.build().state_dict().items()}
    transformer = HunyuanVideo15Transformer3DModel(**C.config_to_diffusers(cfg, target_size=64, task_type="t2v"))
    transformer.load_state_dict(C.to_diffusers(state), strict=True)
    text = transformers.Qwen2_5_VLTextModel(transformers.Qwen2_5_VLTextConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=2048, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}))
    byt5 = transformers.T5EncoderModel(transformers.T5Config(vocab_size=384, d_model=12, d_kv=6, d_ff=24,
                                                             num_layers=1, num_heads=2))
    _qwen_tokenizer(root / "tokenizer")
    pipe = HunyuanVideo15Pipeline(text_encoder=text.eval(), tokenizer=transformers.AutoTokenizer.from_pretrained(
        str(root / "tokenizer")), transformer=transformer.eval(), vae=tiny_vae(cfg.out_channels),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), text_encoder_2=byt5.eval(),
        tokenizer_2=transformers.ByT5Tokenizer(), guider=ClassifierFreeGuidance(guidance_scale=GUIDANCE))
    pipe.save_pretrained(str(root))
    return root


def test_prompts_encode_as_the_pipeline_does(folder):
    """Qwen2.5-VL states (template, third-to-last layer, 108-token crop) and ByT5 glyph states, bitwise."""
    from diffusers import HunyuanVideo15Pipeline

    from nemo_vfm.tokenizers.byt5 import ByT5GlyphEncoder, glyph_text
    from nemo_vfm.tokenizers.registry import build_text_encoder

    pipe = HunyuanVideo15Pipeline.from_pretrained(str(folder))
    prompts = [PROMPT, ""]
    emb, mask = build_text_encoder("qwen2_5_vl", path=str(folder), template="hunyuanvideo1_5").encode(prompts)
    want, wmask = pipe._get_mllm_prompt_embeds(pipe.text_encoder, pipe.tokenizer, prompts, "cpu",
                                               system_message=pipe.system_message)
    assert emb.shape == (2, 1000, 16) and torch.equal(emb, want) and torch.equal(mask, wmask.bool())
    assert mask[1].sum() == 3 and mask[0].sum() == 11 + 3  # after the crop: the prompt's words (" " has none), end,
    # start, assistant
    gemb, gmask = ByT5GlyphEncoder(folder).encode(prompts)
    with torch.no_grad():  # as the pipeline's __call__ (autograd changes the last bits of T5's output)
        gwant, gwmask = pipe._get_byt5_prompt_embeds(pipe.tokenizer_2, pipe.text_encoder_2, prompts, "cpu")
    assert gemb.shape == (2, 256, 12) and torch.equal(gemb, gwant) and torch.equal(gmask, gwmask.bool())
    assert gmask[0].any() and not gmask[1].any()
    assert glyph_text('say "A" and “B” and "A"') == 'Text "A". Text "B". '


def test_sampled_latents_match_the_pipeline(folder):
    from diffusers import HunyuanVideo15Pipeline

    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.hunyuan import generate_hunyuan, glyph_encoder
    from nemo_vfm.inference.sampling import initial_noise

    info = read_checkpoint_info(folder)
    assert info.kind == "hunyuan" and info.objective.shift == 5.0 and info.generation["guidance"] == GUIDANCE
    engine = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32")
    shape, steps = (4, 2, 2, 3), 3
    got, _ = generate_hunyuan(engine, [PROMPT], shape, SamplingConfig(num_steps=steps, guidance=GUIDANCE,
                                                                      sampler="flow-euler", seed=3),
                              glyph_encoder(info), decode=False)
    pipe = HunyuanVideo15Pipeline.from_pretrained(str(folder))
    want = pipe(prompt=PROMPT, height=32, width=48, num_frames=5, num_inference_steps=steps,
                latents=initial_noise((1, *shape), 3), output_type="latent").frames
    assert got.shape == want.shape
    # fp32 summation order only: 1.0e-5 relative (2.6e-5 absolute) with this folder's random weights
    assert (got - want).abs().max() <= 2e-5 * want.abs().max()
    assert (got - initial_noise((1, *shape), 3)).abs().max() > 0.1  # it moved


def test_vfm_generate_writes_a_video(folder, tmp_path):
    """From the pipeline folder, and from its ``--export-safetensors`` file (which keeps the generation settings)."""
    from nemo_vfm.cli.main import main

    exported = tmp_path / "hunyuan.safetensors"
    assert main(["generate", "--ckpt", str(folder), "--export-safetensors", str(exported)]) == 0
    for i, ckpt in enumerate((folder, exported)):
        out = tmp_path / f"videos{i}"
        rc = main(["generate", "--ckpt", str(ckpt), "--prompt", PROMPT, "--frames", "5", "--height", "32", "--width",
                   "32", "--device", "cpu", "--steps", "2", "--guidance", "6", "--out", str(out)])
        assert rc == 0
        assert list(out.rglob("*.mp4"))


def test_folders_that_cannot_generate_say_why(folder, tmp_path, capsys):
    """A transformer folder alone has no encoders; a T2V folder takes no --image; the mean-flow flavor is refused."""
    import json
    import shutil

    from nemo_vfm.cli.main import main

    rc = main(["generate", "--ckpt", str(folder / "transformer"), "--prompt", "a robot", "--device", "cpu"])
    assert rc == 2 and "does not record its tokenizer and text encoder" in capsys.readouterr().err
    rc = main(["generate", "--ckpt", str(folder), "--prompt", "a robot", "--image", "x.png", "--device", "cpu"])
    assert rc == 2 and "--image is for image-to-video models" in capsys.readouterr().err
    meanflow = tmp_path / "meanflow"
    shutil.copytree(folder / "transformer", meanflow / "transformer")
    config = json.loads((meanflow / "transformer" / "config.json").read_text())
    (meanflow / "transformer" / "config.json").write_text(json.dumps({**config, "use_meanflow": True}))
    rc = main(["generate", "--ckpt", str(meanflow), "--prompt", "a robot", "--device", "cpu"])
    assert rc == 2 and "step-distilled (mean-flow)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def i2v_folder(folder, tmp_path_factory):
    """The same components as an I2V pipeline folder, with a tiny SigLIP (hidden 20 = image_dim, 4 patches)."""
    import transformers
    from diffusers import HunyuanVideo15ImageToVideoPipeline, HunyuanVideo15Pipeline

    root = tmp_path_factory.mktemp("hunyuan_i2v")
    torch.manual_seed(1)
    siglip = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(
        hidden_size=20, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=32,
        patch_size=16))
    extractor = transformers.SiglipImageProcessor(size={"height": 32, "width": 32})
    HunyuanVideo15ImageToVideoPipeline(**HunyuanVideo15Pipeline.from_pretrained(str(folder)).components,
                                       image_encoder=siglip.eval(), feature_extractor=extractor).save_pretrained(
        str(root))
    return root


def _image(path, w=100, h=50):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return path


def test_i2v_latents_match_the_pipeline(i2v_folder, tmp_path):
    """The image's bucket size, its VAE latent in frame 0 + mask, and SigLIP states: the I2V pipeline's latents."""
    import PIL.Image
    from diffusers import HunyuanVideo15ImageToVideoPipeline

    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.hunyuan import generate_hunyuan, glyph_encoder, image_conditions, image_size
    from nemo_vfm.inference.sampling import initial_noise

    image = _image(tmp_path / "first.png")
    info = read_checkpoint_info(i2v_folder)
    height, width = image_size(info, image)
    engine = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32")
    extra = image_conditions(info, engine.tokenizer, image, 5, height, width)
    assert extra["cond_latents"].shape == (1, 5, 2, height // 16, width // 16) and extra["image_embeds"].shape[-1] == 20
    shape, steps = (4, 2, height // 16, width // 16), 3
    sampling = SamplingConfig(num_steps=steps, guidance=GUIDANCE, sampler="flow-euler", seed=5)
    got, _ = generate_hunyuan(engine, [PROMPT], shape, sampling, glyph_encoder(info), extra, decode=False)
    pipe = HunyuanVideo15ImageToVideoPipeline.from_pretrained(str(i2v_folder))
    want = pipe(image=PIL.Image.open(image).convert("RGB"), prompt=PROMPT, num_frames=5, num_inference_steps=steps,
                latents=initial_noise((1, *shape), 5), output_type="latent").frames
    assert got.shape == want.shape and (height, width) != (32, 32)  # the 2:1 image's bucket, not a square
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    text_only, _ = generate_hunyuan(engine, [PROMPT], shape, sampling, glyph_encoder(info), decode=False)
    assert (text_only - got).abs().max() > 1e-3  # the image conditions the video


def test_vfm_generate_i2v_writes_a_video(i2v_folder, tmp_path, capsys):
    from nemo_vfm.cli.main import main

    args = ["generate", "--ckpt", str(i2v_folder), "--prompt", PROMPT, "--frames", "5", "--device", "cpu",
            "--steps", "2", "--guidance", "6", "--out", str(tmp_path / "videos")]
    assert main(args) == 2 and "pass --image FIRST_FRAME" in capsys.readouterr().err
    assert main(args + ["--image", str(_image(tmp_path / "first.png"))]) == 0
    assert list((tmp_path / "videos").rglob("*.mp4"))


SHAPE = (4, 1, 3, 3)  # latent (C, T, H, W) of the multi-process runs: 9 tokens


def _parallel_worker(rank, world, folder, layout):
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.distributed import InferenceLayout
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.hunyuan import generate_hunyuan, glyph_encoder
    from nemo_vfm.parallel.joint_context_parallel import JointContextParallelCore

    info = read_checkpoint_info(folder)
    engine = InferenceEngine.from_checkpoint(info, InferenceLayout.for_world(world, **layout), device="cpu",
                                             dtype="fp32")
    assert (engine.text_encoder is None) == (rank != 0)  # only rank 0 encodes; the states are broadcast
    cores = sum(isinstance(m, JointContextParallelCore) for m in engine.net.modules())
    assert cores == (engine.net.cfg.num_layers if layout.get("cp") else 0)
    sampling = SamplingConfig(num_steps=2, guidance=GUIDANCE, sampler="flow-euler", seed=3)
    return generate_hunyuan(engine, [PROMPT], SHAPE, sampling, glyph_encoder(info) if rank == 0 else None,
                            decode=False)[0]


@pytest.mark.parametrize("layout", [dict(cfg_parallel=True), dict(cp=2, cp_kind="a2a")], ids=["cfg-parallel", "cp2"])
def test_two_processes_equal_one(folder, layout):
    """Two gloo processes, CFG-parallel (conditional and unconditional pass each on one) or all-to-all CP2 (the video
    tokens split, the text replicated; 9 tokens, so one is padding): rank 0's text and glyph states reach rank 1,
    and both end with the one-process latents."""
    import sys
    from pathlib import Path

    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.hunyuan import generate_hunyuan, glyph_encoder

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
    from gloo_launcher import run_distributed

    info = read_checkpoint_info(folder)
    engine = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32")
    sampling = SamplingConfig(num_steps=2, guidance=GUIDANCE, sampler="flow-euler", seed=3)
    want = generate_hunyuan(engine, [PROMPT], SHAPE, sampling, glyph_encoder(info), decode=False)[0]
    for got in run_distributed(_parallel_worker, 2, str(folder), layout, timeout=240):
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def _generate_cli_worker(rank, world, folder, out):
    from nemo_vfm.cli.main import main

    return main(["generate", "--ckpt", folder, "--prompt", PROMPT, "--frames", "5", "--height", "32", "--width", "32",
                 "--device", "cpu", "--steps", "1", "--guidance", "6", "--cp", "2", "--out", out])


def test_vfm_generate_with_cp2_writes_a_video(folder, tmp_path):
    """``vfm generate --cp 2`` (as under torchrun, on two gloo processes): all-to-all CP, every rank exits 0."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
    from gloo_launcher import run_distributed

    out = tmp_path / "videos"
    assert run_distributed(_generate_cli_worker, 2, str(folder), str(out), timeout=240) == [0, 0]
    assert list(out.rglob("*.mp4"))
