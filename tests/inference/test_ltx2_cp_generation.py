"""LTX-2 generation on 2 gloo processes (CP2 ring, CP2 all-to-all; text and image to video) gives one process's
video and audio latents at the pipeline's guidance (CFG, STG, modality isolation, rescale), and ``vfm generate --cp 2`` writes rank 0's video with
its sound; ``--cfg-parallel`` is refused. The tiny pipeline folder is test_ltx2_generate's."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
from gloo_launcher import run_distributed  # noqa: E402

pytest.importorskip("diffusers")

from tests.inference.test_ltx2_generate import FRAMES, PROMPT, SIZE, pipe_and_folder  # noqa: E402, F401

CASES = {"cp2_ring": dict(cp=2, cp_kind="ring"), "cp2_a2a": dict(cp=2, cp_kind="a2a")}


def _sampling():
    from nemo_vfm.inference.generate import SamplingConfig

    return SamplingConfig(num_steps=2, guidance=3.0, sampler="flow-euler", seed=3)


def _latents(engine, image=False):
    from nemo_vfm.inference.ltx2 import LTX2Guidance, generate_ltx2, image_latents
    from tests.inference.test_ltx2_generate import _image

    first = image_latents(engine.tokenizer, _image(), SIZE, SIZE) if image else None
    lat, _ = generate_ltx2(engine, None, [PROMPT, "loud music"], FRAMES, SIZE, SIZE, _sampling(),
                           LTX2Guidance(stg_blocks=(1,)), decode=False, first_frame=first)
    return lat


def _worker(rank, world, folder, out):
    from nemo_vfm.cli.main import main
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.distributed import InferenceLayout
    from nemo_vfm.inference.ltx2 import ltx2_checkpoint_info

    result = {}
    for name, kw in CASES.items():
        engine = InferenceEngine.from_checkpoint(ltx2_checkpoint_info(folder), InferenceLayout(**kw), device="cpu",
                                                 dtype="fp32")
        result[name] = _latents(engine)
    result["cp2_image"] = _latents(engine, image=True)  # per-token times (the clean first frame) split over CP
    base = ["generate", "--ckpt", folder, "--prompt", PROMPT, "--frames", str(FRAMES), "--height", str(SIZE),
            "--width", str(SIZE), "--device", "cpu", "--steps", "2", "--no-gif"]
    result["cli"] = main(base + ["--cp", "2", "--out", out])
    result["cfg_parallel"] = main(base + ["--cfg-parallel", "--out", out + "_cfg"])
    return result


@pytest.fixture(scope="module")
def results(pipe_and_folder, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("ltx2_cp") / "videos"
    return run_distributed(_worker, 2, str(pipe_and_folder[1]), str(out), timeout=300), out


def test_layouts_match_one_process(pipe_and_folder, results):  # noqa: F811
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.ltx2 import ltx2_checkpoint_info

    engine = InferenceEngine.from_checkpoint(ltx2_checkpoint_info(pipe_and_folder[1]), device="cpu", dtype="fp32")
    refs = {name: _latents(engine) for name in CASES}
    refs["cp2_image"] = _latents(engine, image=True)
    for name, ref in refs.items():
        for r in range(2):
            for key in ("latents", "audio_latents"):
                got = results[0][r][name][key]
                torch.testing.assert_close(got, ref[key], rtol=0, atol=1e-4, msg=f"{name} rank {r} {key}")


def test_vfm_generate_cp2_writes_video_with_sound(results):
    import av

    ranks, out = results
    assert [r["cli"] for r in ranks] == [0, 0]
    with av.open(str(out / "batch000.mp4")) as c:
        assert len(c.streams.video) == 1 and len(c.streams.audio) == 1
    assert (out / "batch000.wav").is_file()
    assert [r["cfg_parallel"] for r in ranks] == [2, 2]
