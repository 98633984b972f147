"""CPU path of bench/wan_step.py (the GPU figures come from the device machine)."""

import json

import pytest
import wan_step

pytest.importorskip("diffusers")


@pytest.mark.parametrize("mode", ["full", "infer"])
def test_tiny_cpu_run_writes_json(tmp_path, mode):
    out = tmp_path / "r.json"
    assert wan_step.main(["--device", "cpu", "--tiny", "--mode", mode, "--steps", "1", "--warmup", "1",
                          "--commit", "abc", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["device"] == "cpu" and d["commit"] == "abc" and d["date"] and d["mode"] == mode
    assert d["tokens"] == 2 * 2 * 2  # latent (2, 4, 4) at patch (1, 2, 2)
    r = d["results"]
    assert r["ours"]["ms"] > 0 and r["diffusers"]["ms"] > 0
    assert r["ratio"] == pytest.approx(r["diffusers"]["ms"] / r["ours"]["ms"])


def test_the_default_size_is_480p_81_frames():
    a = wan_step.parse_args(["--mode", "full"])
    assert a.latent == (21, 60, 104) and a.compile and a.ac == "full"
    assert wan_step.parse_args(["--mode", "infer"]).compile is False  # vfm generate does not compile
