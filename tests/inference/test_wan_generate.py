"""``vfm generate --ckpt WAN_PIPELINE_FOLDER``: text-to-video and image-to-video from tiny random Wan pipeline
folders (transformer/, vae/, text_encoder/, tokenizer/, image_encoder/, image_processor/) written here;
Wan's negative-prompt CFG, and the I2V conditioning equal to diffusers' WanImageToVideoPipeline."""

import numpy as np
import pytest
import torch

from nemo_vfm.cli.main import main
from nemo_vfm.io.video import read_video

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

WORDS = "a red green blue circle square moving left right on background black"


def _tokenizer(folder):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.normalizer, tk.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tk.train_from_iterator([WORDS], trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"]))
    tk.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(str(folder))


def _pipeline(root, i2v: bool):
    from nemo_vfm.models.wan.convert import save_weights
    from nemo_vfm.models.wan.model import WanConfig

    torch.manual_seed(0)
    cfg = WanConfig(num_layers=2, hidden_size=24, num_heads=2, ffn_size=32, in_channels=4 + (8 if i2v else 0),
                    out_channels=4, context_dim=16, freq_dim=16, image_dim=32 if i2v else None)
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    save_weights(net.state_dict(), root / "transformer", cfg, layout="diffusers")
    diffusers.AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                               temperal_downsample=[False, True, True], latents_mean=[0.1, 0.2, 0.3, 0.4],
                               latents_std=[2.0, 2.0, 3.0, 3.0]).save_pretrained(str(root / "vae"))
    transformers.UMT5EncoderModel(transformers.UMT5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                                          num_heads=4)).save_pretrained(str(root / "text_encoder"))
    _tokenizer(root / "tokenizer")
    if i2v:
        transformers.CLIPVisionModel(transformers.CLIPVisionConfig(
            hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2, image_size=32,
            patch_size=16)).save_pretrained(str(root / "image_encoder"))
        transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
                                        ).save_pretrained(str(root / "image_processor"))
    return root


@pytest.fixture(scope="module")
def t2v(tmp_path_factory):
    return _pipeline(tmp_path_factory.mktemp("wan_t2v"), False)


@pytest.fixture(scope="module")
def i2v(tmp_path_factory):
    root = _pipeline(tmp_path_factory.mktemp("wan_i2v"), True)
    from PIL import Image

    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(root / "first.png")
    return root


SIZE = ["--frames", "5", "--height", "32", "--width", "32", "--device", "cpu", "--steps", "2"]


def test_text_to_video_from_a_pipeline_folder(t2v, tmp_path, capsys):
    rc = main(["generate", "--ckpt", str(t2v), "--prompt", "a red circle moving left", "--out", str(tmp_path),
               "--flow-shift", "3", *SIZE])
    assert rc == 0, capsys.readouterr().err
    frames, fps = read_video(tmp_path / "batch000.mp4")
    assert frames.shape[0] == 5 and fps == 16.0
    assert (tmp_path / "batch000.gif").is_file()  # a gif beside the mp4 by default; --no-gif: the mp4 alone
    rc = main(["generate", "--ckpt", str(t2v), "--prompt", "a red circle", "--out", str(tmp_path / "mp4"), "--no-gif",
               *SIZE])
    assert rc == 0 and sorted(p.name for p in (tmp_path / "mp4").iterdir()) == ["batch000.mp4", "batch000.txt"]
    # an I2V-only option is refused with a message
    assert main(["generate", "--ckpt", str(t2v), "--prompt", "x", "--image", "y.png", *SIZE]) == 2
    assert "--image is for image-to-video" in capsys.readouterr().err


def test_transformer_only_folder_names_what_is_missing(t2v, capsys):
    assert main(["generate", "--ckpt", str(t2v / "transformer"), "--prompt", "x", *SIZE]) == 2
    assert "without vae/" in capsys.readouterr().err


def test_cfg_contrasts_the_encoded_negative_prompt(t2v):
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine

    info = read_checkpoint_info(t2v)
    assert info.kind == "wan" and info.objective.shift == 5.0 and info.generation["negative_prompt"] == ""
    engine = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32")
    cond, uncond = engine.encode_text(["a red circle", "a blue square"])
    emb, mask = engine.text_encoder.encode(["", ""])
    assert torch.equal(uncond["context"], emb) and torch.equal(uncond["context_mask"], mask)
    assert not torch.equal(cond["context"], emb)
    # the engine's network is the folder's transformer
    from nemo_vfm.models.wan.convert import load_pretrained

    ref = load_pretrained(t2v)
    for k, v in ref.state_dict().items():
        assert torch.equal(engine.net.state_dict()[k], v), k


def test_default_unipc_sampling_matches_diffusers_wan_pipeline(t2v):
    """A Wan folder samples with UniPC by default; the denoised latents equal diffusers' WanPipeline with its
    UniPCMultistepScheduler (flow prediction, the folder's shift) from the same noise, prompt and negative prompt."""
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.sampling import initial_noise

    info = read_checkpoint_info(t2v)
    assert info.generation["sampler"] == "unipc"
    engine = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32")
    prompt, steps, shape = "a red circle moving left", 6, (4, 2, 4, 4)
    cond, uncond = engine.encode_text([prompt])
    ours = engine.denoise(cond, uncond, shape, SamplingConfig(sampler="unipc", num_steps=steps, guidance=5.0, seed=3))
    scheduler = diffusers.UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                  flow_shift=info.objective.shift, num_train_timesteps=1000)
    pipe = diffusers.WanPipeline(
        tokenizer=transformers.AutoTokenizer.from_pretrained(str(t2v / "tokenizer")),
        text_encoder=transformers.UMT5EncoderModel.from_pretrained(str(t2v / "text_encoder")),
        vae=diffusers.AutoencoderKLWan.from_pretrained(str(t2v / "vae")), scheduler=scheduler,
        transformer=diffusers.WanTransformer3DModel.from_pretrained(str(t2v / "transformer")))
    ref = pipe(prompt=prompt, negative_prompt="", num_frames=5, height=32, width=32, num_inference_steps=steps,
               guidance_scale=5.0, latents=initial_noise((1, *shape), 3), output_type="latent").frames
    assert ref.shape == ours.shape
    assert (ours - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_image_to_video_and_its_conditioning_match_diffusers(i2v, tmp_path, capsys):
    rc = main(["generate", "--ckpt", str(i2v), "--prompt", "a red circle", "--image", str(i2v / "first.png"),
               "--out", str(tmp_path), *SIZE])
    assert rc == 0, capsys.readouterr().err
    frames, _ = read_video(tmp_path / "batch000.mp4")
    assert frames.shape[0] == 5
    assert main(["generate", "--ckpt", str(i2v), "--prompt", "x", *SIZE]) == 2
    assert "pass --image" in capsys.readouterr().err

    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.wan import image_conditions, load_image
    from nemo_vfm.tokenizers.registry import build_tokenizer

    info = read_checkpoint_info(i2v)
    tok = build_tokenizer("wan", path=str(i2v))
    ours = image_conditions(info, tok, i2v / "first.png", 1, 5, 32, 32)
    pipe = diffusers.WanImageToVideoPipeline(
        tokenizer=transformers.AutoTokenizer.from_pretrained(str(i2v / "tokenizer")),
        text_encoder=transformers.UMT5EncoderModel.from_pretrained(str(i2v / "text_encoder")),
        vae=diffusers.AutoencoderKLWan.from_pretrained(str(i2v / "vae")),
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0),
        image_processor=transformers.CLIPImageProcessor.from_pretrained(str(i2v / "image_processor")),
        image_encoder=transformers.CLIPVisionModel.from_pretrained(str(i2v / "image_encoder")),
        transformer=diffusers.WanTransformer3DModel.from_pretrained(str(i2v / "transformer")))
    img = load_image(i2v / "first.png", 32, 32)
    _, condition = pipe.prepare_latents(img[None], 1, 4, 32, 32, 5, torch.float32, "cpu",
                                        torch.Generator().manual_seed(0))
    assert ours["cond_latents"].shape == condition.shape == (1, 8, 2, 4, 4)
    torch.testing.assert_close(ours["cond_latents"], condition, atol=1e-5, rtol=1e-5)
    pixels = ((img + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).numpy()
    torch.testing.assert_close(ours["image_embeds"], pipe.encode_image(pixels, "cpu"), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_torchrun_cp2_with_negative_prompt_cfg_writes_the_single_process_video(t2v, tmp_path):
    """Under torchrun the prompts and the negative prompt are encoded on rank 0 and broadcast; CP2 generation
    writes the video of one process."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    args = ["generate", "--ckpt", str(t2v), "--prompt", "a red circle moving left", *SIZE]
    assert main(args + ["--out", str(tmp_path / "one")]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as s:  # a free port, not torchrun's default 29500 (other runs on the machine may hold it)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--master-port", str(port), "-m",
                        "nemo_vfm.cli.main", *args, "--cp", "2", "--out", str(tmp_path / "cp2")],
                       capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2], env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "on 2 process(es): cp=2" in r.stdout
    # another prompt: what a wrong broadcast would change
    assert main(["generate", "--ckpt", str(t2v), "--prompt", "a blue square moving up", *SIZE,
                 "--out", str(tmp_path / "other")]) == 0
    one, cp2, other = (read_video(tmp_path / d / "batch000.mp4")[0].astype(int) for d in ("one", "cp2", "other"))
    assert one.shape == cp2.shape
    # Bit-identical on some CPUs; on others the split sequence rounds differently (~1e-6), and a flipped uint8
    # changes the h264 encoder's choices in its block (CI once saw one pixel 41 off). So: CP2 must be far
    # closer to one process than another prompt is (a random tiny Wan barely follows its prompt: ~1.5 levels).
    d_cp2, d_other = np.abs(one - cp2), np.abs(one - other)
    assert d_cp2.mean() < 0.2 * d_other.mean(), (d_cp2.mean(), d_cp2.max(), d_other.mean(), d_other.max())


def test_engine_compile_option_compiles_the_blocks(monkeypatch):
    """vfm generate --compile / InferenceEngine(compile=True) compiles each block (measured separately: a tiny
    Wan's CFG latents equal the eager ones on CPU, 143 s of compilation, too slow for the suite)."""
    import nemo_vfm.parallel.compile as C
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.models.wan.flavors import wan_config, wan_objective

    seen = []
    monkeypatch.setattr(C, "compile_blocks", lambda blocks, **kw: seen.append(blocks))
    net = wan_config("tiny").build()
    InferenceEngine.from_model(net, wan_objective("tiny"), device="cpu", compile=True)
    assert seen == [net.blocks]


def test_a_pipeline_folder_samples_with_its_scheduler_shift(t2v, tmp_path):
    """diffusers' pipeline folders name the shift their UniPC scheduler samples with; a folder without one (or with
    another scheduler) samples with the flavor's."""
    import json

    from nemo_vfm.inference.checkpoint import read_checkpoint_info

    folder = tmp_path / "pipe"
    folder.mkdir()
    for sub in ("transformer", "vae", "text_encoder", "tokenizer"):
        (folder / sub).symlink_to(t2v / sub)
    assert read_checkpoint_info(folder).objective.shift == 5.0
    (folder / "scheduler").mkdir()
    config = diffusers.UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                               flow_shift=3.0).config
    (folder / "scheduler" / "scheduler_config.json").write_text(json.dumps(dict(config)))
    info = read_checkpoint_info(folder)
    assert info.objective.shift == 3.0 and info.generation["sampler"] == "unipc"
    (folder / "scheduler" / "scheduler_config.json").write_text(json.dumps({"flow_shift": 3.0}))
    assert read_checkpoint_info(folder).objective.shift == 5.0


def test_generate_compiles_wan_on_cuda_by_default():
    """``vfm generate`` compiles the blocks of Wan checkpoints on CUDA unless told ``--no-compile``; other
    families and the CPU stay eager unless told ``--compile``."""
    import argparse
    from types import SimpleNamespace as NS

    from nemo_vfm.cli.generate import add_arguments, default_compile

    p = argparse.ArgumentParser()
    add_arguments(p)
    parse = lambda *a: p.parse_args(["--ckpt", "x", *a])  # noqa: E731
    wan, dit, cuda, cpu = NS(kind="wan"), NS(kind="dit"), torch.device("cuda"), torch.device("cpu")
    assert default_compile(parse(), wan, cuda) and not default_compile(parse(), wan, cpu)
    assert not default_compile(parse(), dit, cuda)
    assert not default_compile(parse("--no-compile"), wan, cuda) and default_compile(parse("--compile"), dit, cpu)


def test_the_text_encoder_sits_on_the_generation_device_in_bf16_off_the_cpu(t2v):
    """UMT5 runs where the network runs (bf16 off the CPU, as Wan runs it), not in float32 on the CPU: on one H100
    a CPU encoder was ~1.6 s per prompt pair for 2 of UMT5-XXL's 24 layers, ~7.7 s under torchrun's one thread.
    ``text_encoder_device`` moves it (``meta`` stands in for a GPU here); the CPU keeps the saved float32."""
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine

    info = read_checkpoint_info(t2v)
    cpu = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32").text_encoder.model
    assert {(p.device.type, p.dtype) for p in cpu.parameters()} == {("cpu", torch.float32)}
    away = InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32", text_encoder_device="meta")
    assert {(p.device.type, p.dtype) for p in away.text_encoder.model.parameters()} == {("meta", torch.bfloat16)}
    assert next(away.net.parameters()).device.type == "cpu"


@pytest.mark.gpu
def test_vfm_generate_puts_the_text_encoder_on_the_gpu_unless_told_cpu(t2v, tmp_path, monkeypatch):
    from nemo_vfm.inference import cp_engine

    seen = []
    build = cp_engine.InferenceEngine.from_checkpoint.__func__

    def spy(cls, *a, **k):
        engine = build(cls, *a, **k)
        seen.append({(p.device.type, p.dtype) for p in engine.text_encoder.model.parameters()})
        return engine

    monkeypatch.setattr(cp_engine.InferenceEngine, "from_checkpoint", classmethod(spy))
    for extra, want in (([], ("cuda", torch.bfloat16)), (["--text-encoder-device", "cpu"], ("cpu", torch.float32))):
        assert main(["generate", "--ckpt", str(t2v), "--prompt", "a red circle", *SIZE[:6], "--steps", "2",
                     "--device", "cuda", "--out", str(tmp_path / "v"), *extra]) == 0
        assert seen.pop() == {want}
