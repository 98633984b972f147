"""CPU path of the sparse-attention benchmark (the GPU figures come from the device machine)."""

import argparse
import json

import pytest
import torch
import torch.nn.functional as F

import nemo_vfm.parallel.sparse_attention as sa
from bench import sparse_attention as sab


def test_tiny_cpu_run_times_every_variant_and_checks_it(tmp_path):
    out = tmp_path / "s.json"
    argv = ["--device", "cpu", "--shape", "tiny", "--sdpa", "default", "--warmup", "0", "--iters", "2"]
    assert sab.main(argv + ["--commit", "abc", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["device"] == "cpu" and d["commit"] == "abc" and d["date"]
    assert d["shape"] == {"B": 1, "H": 2, "grid_thw": [3, 5, 6], "tokens": 90, "D": 16}
    r = d["results"]
    assert set(r) == {"dense_default", "sta_1x1x1", "sta_1x3x1", "vsa_0.5"}
    for name, v in r.items():
        assert "error" not in v, (name, v)
        assert (
            v["fwd_ms"] > 0 and v["fwd_bwd_ms"] > 0 and v["fwd_bwd_tflops"] > 0 and v["fwd_bwd_speedup"] > 0
        )
        assert 0 <= v["out_rel_err"] < 2e-2, (
            name,
            v["out_rel_err"],
        )  # bf16 against the fp32 / masked reference
    assert r["sta_1x1x1"]["density"] == pytest.approx(1 / 12) and r["vsa_0.5"]["topk"] == 6
    assert r["sta_1x3x1"]["padded_tokens"] == 192 and r["sta_1x3x1"]["tiles"] == 12
    assert (r["vsa_0.5"]["backend_fwd"], r["vsa_0.5"]["backend_fwd_bwd"]) == (
        "flex",
        "dense",
    )  # no CPU flex backward


def test_a_kernel_that_ignores_the_pattern_is_caught(monkeypatch):
    """Dense attention passed off as sparse is reported with a large error against the masked reference."""
    monkeypatch.setattr(
        sa, "sparse_attention", lambda q, k, v, pattern, **_: F.scaled_dot_product_attention(q, k, v)
    )
    args = argparse.Namespace(dtype="float32", backend="auto", warmup=0, iters=1)
    pattern = sa.SparsePattern(kind="sta", grid_thw=(3, 5, 6), tile=(2, 2, 4), window=(1, 1, 1))
    r = sab.measure(pattern, sab.SHAPES["tiny"][0], args, torch.device("cpu"))
    assert r["out_rel_err"] > 0.1


def test_bad_shape_and_window_are_named():
    with pytest.raises(SystemExit, match="unknown shape 'nope'"):
        sab.main(["--device", "cpu", "--shape", "nope"])
    with pytest.raises(ValueError, match="STA window sizes must be odd"):
        sab.main(["--device", "cpu", "--shape", "tiny", "--sta-windows", "2x1x1"])
