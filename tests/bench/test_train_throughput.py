"""CPU paths of the bare-step benchmark (bench/train_throughput.py; the GPU figures come from the device machine)."""

import json

import pytest

from bench import train_throughput as tt


def test_tiny_cpu_run_writes_json(tmp_path):
    out = tmp_path / "r.json"
    assert tt.main(["--device", "cpu", "--tiny", "--commit", "abc", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["device"] == "cpu" and d["commit"] == "abc" and d["date"]
    (r,) = d["results"]
    assert r["step_s"] > 0 and r["samples_per_s"] == pytest.approx(2 / r["step_s"])
    assert r["tokens_per_step"] == 2 * 2 * 4 * 4  # batch 2 of (2, 8, 8) latents at patch (1, 2, 2)
    assert r["model_tflops"] > 0 and r["mfu"] is None  # no peak for a CPU


def test_tiny_packed_cpu_run(tmp_path):
    out = tmp_path / "p.json"
    assert tt.main(["--device", "cpu", "--tiny", "--packed", "1x2x8x8,2x1x8x8", "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["samples_per_step"] == 3 and r["tokens_per_step"] == 32 + 2 * 16


def test_bf16_master_weights_step_updates_fp32_masters():
    s = tt.BenchSettings(flavor="tiny", latent=(2, 8, 8), batch=2, text_len=8, context_dim=32, in_channels=4,
                         precision="bf16", compile=False, steps=1, warmup=0)
    import torch

    model, step, flops, lens = tt.build_step(s, torch.device("cpu"))
    before = [p.detach().float().clone() for p in model.parameters()]
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    step()
    assert any(not torch.equal(b, p.float()) for b, p in zip(before, model.parameters()))
    assert flops.train_step > 0 and lens == [32, 32]


def test_suites_and_validation():
    for name in ("xl", "7b", "packed"):
        assert tt.suite(name)
    assert all(c.original and c.batch <= 176 for c in tt.suite("xl"))
    with pytest.raises(ValueError, match="unknown suite"):
        tt.suite("nope")
    with pytest.raises(ValueError, match="precision"):
        tt.BenchSettings(precision="fp8")
    with pytest.raises(ValueError, match="packed"):
        tt.BenchSettings(original=True, packed=((1, 1, 8, 8),))


def test_profiler_ranges_are_not_counted_as_kernels():
    from types import SimpleNamespace

    is_annotation = tt.is_annotation
    # torch lists Optimizer.step's range on the GPU timeline as well: adding it counted the step's kernels twice
    assert is_annotation(SimpleNamespace(key="Optimizer.step#AdamW.step"))
    assert is_annotation(SimpleNamespace(key="my_range", is_user_annotation=True))
    assert not is_annotation(SimpleNamespace(key="nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN",
                                             is_user_annotation=False))
