"""Cosmos-Predict2.5 Video2World / Image2World from ``vfm generate --video`` / ``--image`` on the tiny random pipeline
folder of test_cosmos_generate.py: the conditioning latents are the folder VAE's encoding of the clip's last 5 frames
padded with its last frame, the engine's latents equal diffusers' Cosmos2_5_PredictBasePipeline given the same clip,
and bad inputs fail with one sentence."""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nemo_vfm.cli.main import main

pytest.importorskip("diffusers")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cosmos_generate import _pipe, folder  # noqa: E402, F401  (the tiny pipeline folder fixture)

H = W = 32
FRAMES = 9  # -> 3 latent frames; Video2World keeps 2 clean


def _clip(path, n=7):
    """An mp4 of ``n`` smooth 32x32 frames (a moving colour ramp); returns the decoded frames (T, H, W, 3)."""
    from nemo_vfm.io.video import read_video, write_video

    y, x = np.mgrid[0:H, 0:W]
    frames = [
        np.stack([(x * 8 + 20 * t) % 256, (y * 8) % 256, np.full_like(x, 40 * t % 256)], -1) for t in range(n)
    ]
    write_video(path, np.stack(frames).astype(np.uint8), fps=16)
    return read_video(path)[0]


@pytest.fixture(scope="module")
def engine(folder):  # noqa: F811
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine

    return InferenceEngine.from_checkpoint(read_checkpoint_info(folder), device="cpu", dtype="fp32")


def test_video2world_latents_match_the_diffusers_pipeline(folder, engine, tmp_path):  # noqa: F811
    from nemo_vfm.inference.cosmos import conditioning_latents, denoise_video2world
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.inference.sampling import initial_noise
    from nemo_vfm.io.video import frames_to_tensor

    pixels = _clip(tmp_path / "clip.mp4")
    video = frames_to_tensor(pixels)[None]  # (1, 3, 7, H, W) in [-1, 1]
    first = conditioning_latents(engine.tokenizer, FRAMES, H, W, video=tmp_path / "clip.mp4")
    padded = torch.cat([video[:, :, -5:], video[:, :, -1:].expand(-1, -1, FRAMES - 5, -1, -1)], dim=2)
    with torch.no_grad():
        torch.testing.assert_close(first, engine.tokenizer.encode(padded)[:, :, :2].float())

    prompt, steps, shape = "a red robot arm welding metal", 3, (4, 3, 4, 4)
    cond, uncond = engine.encode_text([prompt])
    ours = denoise_video2world(
        engine,
        cond,
        uncond,
        shape,
        SamplingConfig(sampler="unipc", num_steps=steps, guidance=1.0 + 3.0, seed=3),
        first,
    )
    ref = _pipe(folder)(
        prompt=prompt,
        video=video,
        height=H,
        width=W,
        num_frames=FRAMES,
        num_inference_steps=steps,
        guidance_scale=3.0,
        latents=initial_noise((1, *shape), 3),
        output_type="latent",
        num_latent_conditional_frames=2,
    ).frames
    assert ref.shape == ours.shape
    assert (ours - ref).abs().max() <= 1e-4 * ref.abs().max()
    # the clean frames travel the straight line from the noise to the clip's latents
    assert (ours[:, :, :2] - first).abs().max() <= 0.1 * first.abs().max()
    assert (
        ours[:, :, 2] - first[:, :, 1]
    ).abs().max() > 0.1 * first.abs().max()  # the new frame is generated


@pytest.mark.parametrize("mode", ["video", "image"])
def test_vfm_generate_conditions_on_the_clip(folder, tmp_path, monkeypatch, mode):  # noqa: F811
    import nemo_vfm.inference.cosmos as cosmos

    pixels = _clip(tmp_path / "clip.mp4")
    if mode == "image":
        from PIL import Image

        Image.fromarray(pixels[0]).save(tmp_path / "first.png")
    seen = {}
    real = cosmos.denoise_video2world

    def spy(engine, cond, uncond, latent_shape, sampling, cond_frames, progress=False):
        seen["first"] = cond_frames
        seen["latents"] = real(engine, cond, uncond, latent_shape, sampling, cond_frames, progress)
        return seen["latents"]

    monkeypatch.setattr(cosmos, "denoise_video2world", spy)
    flag = (
        ["--video", str(tmp_path / "clip.mp4")]
        if mode == "video"
        else ["--image", str(tmp_path / "first.png")]
    )
    out = tmp_path / "videos"
    rc = main(
        [
            "generate",
            "--ckpt",
            str(folder),
            "--prompt",
            "a robot arm welding",
            "--frames",
            str(FRAMES),
            "--height",
            str(H),
            "--width",
            str(W),
            "--device",
            "cpu",
            "--steps",
            "2",
            "--guidance",
            "8",
            "--out",
            str(out),
            *flag,
        ]
    )
    assert rc == 0
    assert list(out.rglob("*.mp4"))
    n = 2 if mode == "video" else 1
    first, latents = seen["first"], seen["latents"]
    assert first.shape == (1, 4, n, H // 8, W // 8) and latents.shape == (1, 4, 3, H // 8, W // 8)
    assert (latents[:, :, :n] - first).abs().max() <= 0.1 * first.abs().max()


def test_bad_inputs_fail_with_one_sentence(folder, tmp_path, capsys, monkeypatch):  # noqa: F811
    import nemo_vfm.inference.checkpoint as checkpoint

    _clip(tmp_path / "short.mp4", n=3)
    base = [
        "generate",
        "--ckpt",
        str(folder),
        "--prompt",
        "a robot",
        "--frames",
        str(FRAMES),
        "--height",
        str(H),
        "--width",
        str(W),
        "--device",
        "cpu",
        "--steps",
        "1",
        "--out",
        str(tmp_path / "o"),
    ]
    cases = [
        (["--video", str(tmp_path / "missing.mp4")], "video file not found"),
        (["--video", str(tmp_path / "short.mp4")], "has 3 frame(s); --cond-frames 2 needs at least 5"),
        (["--video", str(tmp_path / "short.mp4"), "--cond-frames", "3"], "--cond-frames must be 1 or 2"),
        (["--cond-frames", "1"], "add --video CLIP"),
        (["--video", str(tmp_path / "short.mp4"), "--image", "x.png"], "not both"),
    ]
    for extra, message in cases:
        assert main(base + extra) == 2
        assert message in capsys.readouterr().err
    # --cond-frames 1 takes the short clip's last frame
    assert main(base + ["--video", str(tmp_path / "short.mp4"), "--cond-frames", "1", "--guidance", "1"]) == 0
    capsys.readouterr()
    read = checkpoint.read_checkpoint_info
    monkeypatch.setattr(
        checkpoint,
        "read_checkpoint_info",
        lambda *a, **k: dataclasses.replace(read(*a, **k), kind="safetensors"),
    )
    assert main(base + ["--video", str(tmp_path / "short.mp4")]) == 2
    assert "--video is Cosmos-Predict2.5 Video2World" in capsys.readouterr().err
