"""Kandinsky 6 generation on 2 gloo processes (CP2, the video tokens split, the audio stream replicated on every
rank): with sound (text and image to video) and video only, every rank's latents equal one process's, and ``vfm
generate --cp 2`` writes rank 0's video with its sound. The tiny folder is test_kandinsky6_audio_generate's."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
from gloo_launcher import run_distributed  # noqa: E402

pytest.importorskip("diffusers")

from tests.inference.test_kandinsky6_audio_generate import (  # noqa: E402, F401
    PROMPT,
    SHAPE,
    _sampling,
    audio_folder,
    folder,
)

LAT = (1, 4, 2, 4)  # an image latent (1, C, h, w)


def _latents(engine, clip, root):
    from nemo_vfm.inference.kandinsky6 import audio_length, generate_kandinsky6, generate_kandinsky6_av

    prompts, length = [PROMPT, "hello"], audio_length(root, SHAPE[1], 4)
    image = {"image_latents": torch.randn(LAT, generator=torch.Generator().manual_seed(7))}
    out = {"video_only": generate_kandinsky6(engine, prompts, SHAPE, _sampling(), clip, decode=False)[0]}
    for name, extra in (("av", None), ("av_image", image)):
        got = generate_kandinsky6_av(engine, None, prompts, SHAPE, length, _sampling(), clip, extra, decode=False,
                                     skip=(1, 4, 1, 2, 4) if extra else None)[0]
        out[name], out[name + "_audio"] = got["latents"], got["audio_latents"]
    return out


def _worker(rank, world, root, out):
    from nemo_vfm.cli.main import main
    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.distributed import InferenceLayout
    from nemo_vfm.inference.kandinsky6 import clip_encoder
    from nemo_vfm.models.kandinsky6.family import GatherKeysCore

    info = read_checkpoint_info(root)
    engine = InferenceEngine.from_checkpoint(info, InferenceLayout(cp=2), device="cpu", dtype="fp32")
    assert any(isinstance(m, GatherKeysCore) for m in engine.net.modules())  # the family's CP plan is applied
    result = _latents(engine, clip_encoder(info) if rank == 0 else None, root)
    result["cli"] = main(["generate", "--ckpt", root, "--prompt", PROMPT, "--frames", "5", "--height", "16", "--width",
                          "32", "--device", "cpu", "--steps", "2", "--no-gif", "--cp", "2", "--out", out])
    return result


def test_cp2_matches_one_process_and_writes_sound(audio_folder, tmp_path):  # noqa: F811
    import av

    from nemo_vfm.inference.checkpoint import read_checkpoint_info
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.kandinsky6 import clip_encoder

    out = tmp_path / "videos"
    ranks = run_distributed(_worker, 2, str(audio_folder), str(out), timeout=300)
    info = read_checkpoint_info(audio_folder)
    ref = _latents(InferenceEngine.from_checkpoint(info, device="cpu", dtype="fp32"), clip_encoder(info), audio_folder)
    for r in range(2):
        for key, want in ref.items():
            torch.testing.assert_close(ranks[r][key], want, rtol=0, atol=1e-4, msg=f"rank {r} {key}")
    assert [r["cli"] for r in ranks] == [0, 0]
    with av.open(str(out / "batch000.mp4")) as c:
        assert len(c.streams.video) == 1 and len(c.streams.audio) == 1
    assert (out / "batch000.wav").is_file()
