"""bench/generate_scaling.py on the CPU: ``vfm generate`` at one process and under torchrun (gloo, CP2) on a tiny
random Wan pipeline folder written by bench/wan_pipeline_folder.py; a failed run is recorded, not measured."""

import json

import pytest

from bench import generate_scaling as gs
from bench import wan_pipeline_folder

pytest.importorskip("diffusers")
pytest.importorskip("transformers")

SIZE = "--frames 5 --height 32 --width 32"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("wan_tiny")
    assert wan_pipeline_folder.main(["--flavor", "tiny", "--out", str(out), "--text-layers", "1", "--device",
                                     "cpu"]) == 0
    return out


def test_one_process_and_cp2_give_the_same_video_and_a_speedup_row(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "g.json"
    rc = gs.main(["--ckpt", str(folder), "--device", "cpu", "--layout", "1", "--layout", "2:--cp 2", "--steps", "2",
                  "--gen-args", SIZE, "--commit", "abc", "--out", str(out)])
    d = json.loads(out.read_text())
    assert rc == 0, d["results"]
    assert d["device"] == "cpu" and d["commit"] == "abc" and d["child_env"]["NCCL_NVLS_ENABLE"] == "0"
    one, two = d["results"]
    assert one["command"].startswith("NCCL_NVLS_ENABLE=0") and " python -m nemo_vfm.cli.main generate" in one["command"]
    assert "torchrun --standalone --nproc-per-node 2 -m nemo_vfm.cli.main generate" in two["command"]
    assert two["args"] == ["--cp", "2"] and two["layout"] == "cp=2" and two["world"] == 2
    for r in (one, two):
        assert r["batches"] == 2 and r["steps"] == 2 and r["latent"] == [4, 2, 4, 4]
        assert r["denoise_s"] > 0 and r["s_per_step"] == pytest.approx(r["denoise_s"] / 2, rel=1e-3)
        assert r["video_mean_abs_diff"] < 2.0  # the same video from both layouts (fp32 on the CPU)
    assert one["denoise_speedup"] == 1.0
    assert two["denoise_efficiency"] == pytest.approx(one["denoise_s"] / two["denoise_s"] / 2, abs=2e-3)


def test_a_refused_run_is_an_error_row_with_the_reason(folder, tmp_path):
    out = tmp_path / "f.json"
    assert gs.main(["--ckpt", str(folder), "--device", "cpu", "--layout", "1:--cp 3", "--steps", "1",
                    "--gen-args", SIZE, "--out", str(out)]) == 1
    (r,) = json.loads(out.read_text())["results"]
    assert r["error"] == "exit 2" and "s_per_step" not in r
    assert any("cp" in line for line in r["log_tail"])


@pytest.mark.parametrize("text,want", [("1", (1, [])), ("4:--cp 4", (4, ["--cp", "4"])),
                                       ("4:--cfg-parallel --cp 2", (4, ["--cfg-parallel", "--cp", "2"]))])
def test_layout_parsing(text, want):
    assert gs.parse_layout(text) == want


@pytest.mark.parametrize("text", ["x", "0", "two:--cp 2"])
def test_bad_layout_is_refused(text):
    with pytest.raises(ValueError, match="layout"):
        gs.parse_layout(text)


def test_a_one_gpu_run_from_an_earlier_call_is_the_baseline(folder, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    common = ["--ckpt", str(folder), "--device", "cpu", "--steps", "1", "--prompts", "1", "--gen-args", SIZE]
    assert gs.main([*common, "--layout", "1", "--out", str(tmp_path / "one.json")]) == 0
    one = json.loads((tmp_path / "one.json").read_text())["results"][0]
    out = tmp_path / "cp.json"
    assert gs.main([*common, "--layout", "2:--cp 2", "--baseline", str(tmp_path / "one.json"), "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    (two,) = d["results"]
    assert d["baseline"]["denoise_s"] == one["denoise_s"] and d["baseline"]["from"].endswith("one.json")
    assert two["denoise_speedup"] == pytest.approx(one["denoise_s"] / two["denoise_s"], abs=2e-3)
    assert "video_mean_abs_diff" not in two  # the baseline's video is not here
    with pytest.raises(SystemExit):  # other settings than the baseline's: refused before anything runs
        gs.main([*common[:-4], "--steps", "2", "--prompts", "1", "--gen-args", SIZE, "--layout", "2:--cp 2",
                 "--baseline", str(tmp_path / "one.json"), "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
