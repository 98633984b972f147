"""CPU path of the attention-kernel benchmark (the GPU figures come from the device machine)."""

import json

import pytest
import torch

from bench import attention_kernels as ak


def test_tiny_cpu_run_times_and_checks_against_fp32(tmp_path):
    out = tmp_path / "a.json"
    assert ak.main(["--device", "cpu", "--shapes", "tiny", "--backends", "default", "--warmup", "0", "--iters", "2",
                    "--commit", "abc", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["device"] == "cpu" and d["commit"] == "abc"
    r = d["results"]["tiny"]["default"]
    assert r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 and r["fwd_tflops"] > 0
    assert 0 < r["out_rel_err"] < 2e-2 and 0 < r["grad_rel_err"] < 2e-2  # bf16 against fp32 math


def test_cross_attention_shapes_run_under_each_key_mask(tmp_path):
    out = tmp_path / "c.json"
    assert ak.main(["--device", "cpu", "--shapes", "tiny_cross", "--backends", "default", "--masks", "none,bool,float",
                    "--warmup", "0", "--iters", "1", "--out", str(out)]) == 0
    r = json.loads(out.read_text())["results"]["tiny_cross"]
    assert r["text_tokens"] == 8 and r["shape_BHSD"] == [2, 2, 64, 16]
    for mask in ("none", "bool", "float"):  # an all-True mask changes nothing in the result
        m = r[f"default_mask_{mask}"]
        assert m["fwd_ms"] > 0 and 0 < m["out_rel_err"] < 2e-2 and 0 < m["grad_rel_err"] < 2e-2
    with pytest.raises(SystemExit, match="unknown mask 'some'"):
        ak.main(["--device", "cpu", "--shapes", "tiny_cross", "--backends", "default", "--masks", "some"])


def test_error_measure_catches_a_wrong_kernel(monkeypatch):
    """A kernel that forgets the 1/sqrt(D) scale is reported with a large error, not silently timed."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(ak.F, "scaled_dot_product_attention", lambda q, k, v, **kw: sdpa(q, k, v, scale=1.0, **kw))
    r = ak.measure("default", ak.SHAPES["tiny"], 0, 1, torch.device("cpu"))
    assert r["out_rel_err"] > 0.1


def test_unknown_shape_is_named():
    with pytest.raises(SystemExit, match="unknown shape 'nope'"):
        ak.main(["--device", "cpu", "--shapes", "nope"])
