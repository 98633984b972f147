"""Kandinsky 6 sampling: ``FlowMatching(euler_grid="diffusers")`` steps through FlowMatchEulerDiscreteScheduler's grid
exactly; on a tiny random Kandinsky6TI2VAPipeline folder (Qwen2.5-VL + CLIP text encoders, HunyuanVideo VAE, written
here) our encoders give the pipeline's prompt states bitwise, ``generate_kandinsky6`` samples the pipeline's video
latents (``sample_audio=False``) from prompts alone, and from a prompt and an image (the pipeline's tail frame), and
``vfm generate`` writes a video from either; a distilled (PiFlow) folder is refused naming the fix."""

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from nemo_vfm.models.kandinsky6 import convert as C  # noqa: E402
from nemo_vfm.models.kandinsky6.flavors import kandinsky6_config  # noqa: E402

WORDS = "a red robot holds sign that says hello walks in snow system user describe the video"
PROMPT = " ".join(["a red robot walks in snow"] * 6)  # real tokens past the 129-token crop
SHIFT, GUIDANCE = 3.0, 4.0


@pytest.mark.parametrize("shift", [1.0, 3.0, 7.3])
def test_euler_grid_is_the_schedulers(shift):
    from diffusers import FlowMatchEulerDiscreteScheduler

    from nemo_vfm.diffusion.flow_matching import FlowMatching

    for n in (1, 4, 50):
        s = FlowMatchEulerDiscreteScheduler(shift=shift)
        s.set_timesteps(n)
        assert torch.equal(FlowMatching(shift=shift, euler_grid="diffusers").euler_times(n), s.sigmas)


def test_template_is_the_pipelines():
    from diffusers.pipelines.kandinsky6 import pipeline_kandinsky6_ti2va as P

    from nemo_vfm.inference.kandinsky6 import NEGATIVE_PROMPT
    from nemo_vfm.tokenizers.qwen_vl import KANDINSKY6_TEMPLATE

    assert KANDINSKY6_TEMPLATE == P._PROMPT_TEMPLATE and P._QWEN_CROP_START == 129
    assert NEGATIVE_PROMPT == P.Kandinsky6TI2VAPipeline._DEFAULT_NEGATIVE_PROMPT


def _tokenizer(folder, max_len=None):
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.normalizer, tk.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tk.train_from_iterator([WORDS], trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<|im_start|>",
                                                                              "<|im_end|>"]))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", unk_token="<unk>",
                                         model_max_length=max_len or 4096).save_pretrained(str(folder))


def _vae():
    from diffusers import AutoencoderKLHunyuanVideo

    torch.manual_seed(0)
    return AutoencoderKLHunyuanVideo(latent_channels=4, block_out_channels=(8, 16, 16, 16), layers_per_block=1, norm_num_groups=4,
                                     down_block_types=("HunyuanVideoDownBlock3D",) * 4,
                                     up_block_types=("HunyuanVideoUpBlock3D",) * 4).eval()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A Kandinsky6TI2VAPipeline folder at tiny sizes (Qwen hidden 16 = context_dim, CLIP hidden 8 = pooled_dim)."""
    import transformers
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        Kandinsky6TI2VAPipeline,
        Kandinsky6Transformer3DModel,
    )

    root = tmp_path_factory.mktemp("k6_pipe")
    cfg = kandinsky6_config("tiny")
    torch.manual_seed(0)
    state = {k: v + 0.1 * torch.randn_like(v) for k, v in cfg.build().state_dict().items()}
    transformer = Kandinsky6Transformer3DModel(**C.config_to_diffusers(cfg))
    transformer.load_state_dict(C.to_diffusers(state), strict=True)
    text = transformers.Qwen2_5_VLTextModel(transformers.Qwen2_5_VLTextConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=2048, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}))
    clip = transformers.CLIPTextModel(transformers.CLIPTextConfig(
        vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=77, eos_token_id=3, bos_token_id=2, pad_token_id=0))
    _tokenizer(root / "tokenizer")
    _tokenizer(root / "tokenizer_2", 77)
    pipe = Kandinsky6TI2VAPipeline(
        transformer=transformer.eval(), vae=_vae(), text_encoder=text.eval(),
        tokenizer=transformers.AutoTokenizer.from_pretrained(str(root / "tokenizer")), text_encoder_2=clip.eval(),
        tokenizer_2=transformers.AutoTokenizer.from_pretrained(str(root / "tokenizer_2")),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=SHIFT))
    pipe.save_pretrained(str(root))
    return root


def _pipe(folder):
    from diffusers import Kandinsky6TI2VAPipeline

    pipe = Kandinsky6TI2VAPipeline.from_pretrained(str(folder))
    tok = pipe.tokenizer  # a plain tokenizer stands in for Qwen2_5_VLProcessor: drop the image/video inputs
    pipe.tokenizer = lambda text, images=None, videos=None, **kw: tok(text, **kw)
    return pipe


def test_prompts_encode_as_the_pipeline_does(folder):
    from nemo_vfm.tokenizers.clip_pooled import ClipPooledEncoder
    from nemo_vfm.tokenizers.registry import build_text_encoder

    pipe = _pipe(folder)
    prompts = [PROMPT, "hello"]
    emb, mask = build_text_encoder("qwen2_5_vl", path=str(folder), template="kandinsky6").encode(prompts)
    pooled = ClipPooledEncoder(folder).encode(prompts)
    with torch.no_grad():
        want, wpooled, wmask = pipe._get_prompt_embeds(prompts, pipe.tokenizer, pipe.text_encoder, pipe.tokenizer_2,
                                                       pipe.text_encoder_2, 1024, "cpu")
    assert emb.shape == (2, 1024, 16) and torch.equal(emb, want) and torch.equal(mask, wmask)
    assert torch.equal(pooled, wpooled) and pooled.shape == (2, 8)
    assert mask[0].sum() > 6  # the prompt's own tokens are past the crop


def test_sampled_latents_match_the_pipeline(folder):
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.kandinsky6 import clip_encoder, generate_kandinsky6
    from nemo_vfm.inference.sampling import initial_noise

    info = read_checkpoint_info(folder)
    assert info.kind == "kandinsky6" and info.objective.shift == SHIFT and info.objective.euler_grid == "diffusers"
    engine = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32")
    shape, steps = (4, 2, 2, 4), 3
    got, _ = generate_kandinsky6(engine, [PROMPT], shape, SamplingConfig(num_steps=steps, guidance=GUIDANCE,
                                                                         sampler="flow-euler", seed=3),
                                 clip_encoder(info), decode=False)
    pipe = _pipe(folder)
    noise = initial_noise((1, *shape), 3)
    want = pipe(prompt=PROMPT, height=16, width=32, num_frames=5, num_inference_steps=steps, guidance_scale=GUIDANCE,
                latents=noise.clone(), sample_audio=False, output_type="latent", return_dict=False)[0]
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert (got - noise).abs().max() > 0.1  # it moved


def test_vfm_generate_writes_a_video(folder, tmp_path):
    from nemo_vfm.cli.main import main

    out = tmp_path / "videos"
    rc = main(["generate", "--ckpt", str(folder), "--prompt", PROMPT, "--frames", "5", "--height", "32", "--width",
               "32", "--device", "cpu", "--steps", "2", "--guidance", "4", "--out", str(out)])
    assert rc == 0 and list(out.rglob("*.mp4"))


def test_a_distilled_folder_is_refused(folder, tmp_path):
    import json
    import shutil

    from nemo_vfm.inference.checkpoint import read_checkpoint_info

    copy = tmp_path / "distilled"
    shutil.copytree(folder / "transformer", copy / "transformer")
    (copy / "scheduler").mkdir()
    (copy / "scheduler" / "scheduler_config.json").write_text(json.dumps({"_class_name": "PiflowScheduler"}))
    with pytest.raises(NotImplementedError, match="PiflowScheduler"):
        read_checkpoint_info(copy)


def _image(tmp_path, h=32, w=48):
    from PIL import Image

    g = torch.Generator().manual_seed(5)
    pixels = (torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8).numpy()
    path = tmp_path / "first.png"
    Image.fromarray(pixels).save(path)
    return path


def test_image_to_video_matches_the_pipeline(folder, tmp_path):
    """The image's latent is the pipeline's preprocessing + VAE (posterior mode) x scaling; with that latent as the
    pipeline's first-frame latent, the sampled latents match the pipeline's image-to-video call."""
    from PIL import Image

    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.kandinsky6 import clip_encoder, generate_kandinsky6, image_latents
    from nemo_vfm.inference.sampling import initial_noise

    info = read_checkpoint_info(folder)
    engine = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32")
    path = _image(tmp_path)
    lat = image_latents(engine.tokenizer, path, 16, 32)
    pipe = _pipe(folder)
    with torch.no_grad():
        pixels = pipe.video_processor.preprocess(Image.open(path).convert("RGB"), height=16, width=32,
                                                 resize_mode="crop")
        want_lat = pipe.vae.encode(pixels[:, :, None]).latent_dist.mode()[:, :, 0] * pipe.vae.config.scaling_factor
    assert lat.shape == (1, 4, 2, 4) and (lat - want_lat).abs().max() <= 1e-5 * want_lat.abs().max()
    shape, steps = (4, 2, 2, 4), 3
    got, _ = generate_kandinsky6(engine, [PROMPT], shape, SamplingConfig(num_steps=steps, guidance=GUIDANCE,
                                                                         sampler="flow-euler", seed=3),
                                 clip_encoder(info), {"image_latents": lat}, decode=False)
    pipe.encode_image = lambda *a, **k: lat.permute(0, 2, 3, 1)  # the pipeline's (B, h, w, C) first-frame latents
    noise = initial_noise((1, *shape), 3)
    want = pipe(prompt=PROMPT, image=Image.open(path), height=16, width=32, num_frames=5, num_inference_steps=steps,
                guidance_scale=GUIDANCE, latents=noise.clone(), sample_audio=False, output_type="latent",
                return_dict=False)[0]
    assert got.shape == want.shape
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    t2v, _ = generate_kandinsky6(engine, [PROMPT], shape, SamplingConfig(num_steps=steps, guidance=GUIDANCE,
                                                                         sampler="flow-euler", seed=3),
                                 clip_encoder(info), decode=False)
    assert (t2v - got).abs().max() > 1e-3  # the image conditions the video


def test_vfm_generate_from_an_image(folder, tmp_path):
    from nemo_vfm.cli.main import main

    out = tmp_path / "videos"
    rc = main(["generate", "--ckpt", str(folder), "--prompt", PROMPT, "--image", str(_image(tmp_path)), "--frames",
               "5", "--height", "32", "--width", "32", "--device", "cpu", "--steps", "2", "--guidance", "4",
               "--out", str(out)])
    assert rc == 0 and list(out.rglob("*.mp4"))
