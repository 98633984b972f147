"""The scaling harness on the CPU: bench/scaling.py (torchrun + gloo), bench/comm_bandwidth.py and the formulas of
bench/scaling_model.py. The GPU figures come from the device machine (docs/benchmarks.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import scaling
from bench import scaling_model as sm
from bench.comm_bandwidth import OPS, bus_factor

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.num_layers=2", "model.hidden_size=64", "data.num_clips=16", "data.batch_size=2"]


def test_quickstart_at_1_and_2_gloo_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("NCCL_CTA_POLICY", "1")  # a setting the runs see: the JSON records it
    out = tmp_path / "s.json"
    argv = ["--factory", "quickstart", "--device", "cpu", "--nprocs", "1,2", "--steps", "4", "--every", "2",
            "--skip", "1", "--commit", "abc", "--out", str(out)]
    assert scaling.main(argv + [x for o in TINY for x in ("--set", o)]) == 0
    d = json.loads(out.read_text())
    assert d["device"] == "cpu" and d["commit"] == "abc" and d["date"] and d["scaling"] == "weak"
    assert d["child_env"]["NCCL_NVLS_ENABLE"] == "0" and d["child_env"]["NCCL_CTA_POLICY"] == "1"
    assert d["baseline_nprocs"] == 1
    r1, r2 = d["results"]
    assert (r1["nprocs"], r2["nprocs"]) == (1, 2)
    for r in (r1, r2):
        assert "error" not in r, r.get("log_tail")
        assert r["step_s"] > 0 and r["tokens_per_s_per_gpu"] > 0 and r["intervals"] == 1
        assert 0 < r["startup_s"] < r["wall_s"]  # train() to the first step, from perf.jsonl's first row
        assert f"--nproc-per-node {r['nprocs']}" in r["command"]
        assert "launchers/train.py --factory quickstart" in r["command"]
    assert r1["efficiency"] == 1.0
    assert r2["efficiency"] == pytest.approx(r2["tokens_per_s_per_gpu"] / r1["tokens_per_s_per_gpu"])
    assert out.with_suffix(".png").stat().st_size > 0


def test_profile_runs_after_the_timed_steps_on_every_rank(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out, keep = tmp_path / "p.json", tmp_path / "keep"
    argv = ["--factory", "quickstart", "--device", "cpu", "--nprocs", "2", "--steps", "4", "--every", "2", "--skip", "1",
            "--profile", "2", "--keep", str(keep), "--out", str(out)]
    assert scaling.main(argv + [x for o in TINY for x in ("--set", o)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert "error" not in r, r.get("log_tail")
    assert "trainer.max_steps=6" in r["command"] and "trainer.profile_steps=[4,6]" in r["command"]
    assert r["intervals"] == 1 and r["steps_timed"] == 2  # steps 3-4: the profiled steps 5-6 are left out
    assert r["profile"]["steps"] == [5, 6] and r["profile"]["wall_ms_per_step"] > 0
    assert (keep / "quickstart-n2" / "profile" / "rank1.json").exists()


def test_failed_run_is_recorded_with_its_log_not_a_number(tmp_path):
    out = tmp_path / "f.json"
    args = ["--factory", "quickstart", "--device", "cpu", "--nprocs", "1", "--steps", "1", "--set", "model.bogus=1",
            "--out", str(out)]
    assert scaling.main(args) == 1
    (r,) = json.loads(out.read_text())["results"]
    assert r["error"] == "exit 1" and "step_s" not in r and "efficiency" not in r
    assert any("bogus" in line for line in r["log_tail"])  # the rank's error, not torchrun's summary


def test_strong_scaling_batch_and_per_n_overrides():
    assert scaling.strong_batch(16, 4, 1) == 4 and scaling.strong_batch(16, 4, 2) == 8
    with pytest.raises(ValueError, match="does not split"):
        scaling.strong_batch(6, 4, 1)
    assert scaling.parse_set_at(["1:a.b=2", "1:c=d", "2:e=f"]) == {1: ["a.b=2", "c=d"], 2: ["e=f"]}
    with pytest.raises(ValueError, match="N:key=value"):
        scaling.parse_set_at(["a.b=2"])
    rows = [{"nprocs": 1, "step_s": 1.0, "tokens_per_s_per_gpu": 100.0},
            {"nprocs": 2, "step_s": 0.6, "tokens_per_s_per_gpu": 83.3}, {"nprocs": 4, "error": "exit 1"}]
    assert scaling.add_efficiency(rows, strong=True) == 1
    assert rows[1]["efficiency"] == pytest.approx(0.833) and rows[1]["speedup"] == pytest.approx(1 / 0.6)
    assert "efficiency" not in rows[2]


def test_comm_bandwidth_on_2_gloo_processes(tmp_path):
    out = tmp_path / "c.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "bench" / "comm_bandwidth.py"), "--device", "cpu", "--sizes", "4K,64K", "--iters", "2",
           "--warmup", "1", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    d = json.loads(out.read_text())
    assert d["world_size"] == 2 and d["backend"] == "gloo" and d["device"] == "cpu" and d["commit"]
    assert [(x["op"], x["bytes"]) for x in d["results"]] == [(op, s) for op in OPS for s in (4096, 65536)]
    for x in d["results"]:
        assert x["time_us"] > 0
        assert x["busbw_GBps"] == pytest.approx(x["algbw_GBps"] * bus_factor(x["op"], 2))
        assert x["algbw_GBps"] == pytest.approx(x["bytes"] / (x["time_us"] * 1e-6) / 1e9)


def test_bus_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert [bus_factor(op, 4) for op in ("all_gather", "reduce_scatter", "all_to_all")] == [0.75] * 3
    assert bus_factor("all_reduce", 1) == 0


W = sm.Workload(step_s=0.1, flops=1e14, peak_tflops=1000.0, params=1e9, hidden=1000, layers=10, tokens=1000,
                batch=2, attn_share=0.2)


def test_scaling_model_hand_computed():
    bw = sm.Bandwidth(flat=100.0, inter=50.0, gpus_per_node=8)
    one = sm.predict(W, sm.Layout(), 1, bw)
    assert one["step_s"] == pytest.approx(0.1) and one["mfu"] == pytest.approx(1.0) and one["efficiency"] == 1.0
    # FSDP over 2: 2 all-gathers of 2 GB bf16 params + a reduce-scatter of 4 GB fp32 grads, (n-1)/n at 100 GB/s
    # = 0.01 + 0.01 + 0.02 s; 80% hidden behind 0.1 s of compute -> 0.008 s exposed
    q = sm.predict(W, sm.Layout(overlap=0.8), 2, bw)
    assert q["dp_comm_s"] == pytest.approx(0.04) and q["step_s"] == pytest.approx(0.108)
    assert q["mfu"] == pytest.approx(0.1 / 0.108) and q["efficiency"] == pytest.approx(0.1 / 0.108)
    # TP2 + SP: 10 layers x 4 x (AG + RS) of 2 x 1000 x 1000 x 2 B = 4 MB, each 4e6 x 1/2 / 1e11 = 2e-5 s
    q = sm.predict(W, sm.Layout(tp=2, sp=True), 2, bw)
    assert q["compute_s"] == pytest.approx(0.05) and q["tp_s"] == pytest.approx(1.6e-3)
    assert q["step_s"] == pytest.approx(0.0516) and q["mfu"] == pytest.approx(0.05 / 0.0516)
    # CP2 ring: 3 K/V passes of 4 MB at 100 GB/s (1.2e-4 s) per layer hide behind 1 ms of attention per layer
    q = sm.predict(W, sm.Layout(cp=2), 2, bw)
    assert q["cp_exposed_s"] == 0 and q["step_s"] == pytest.approx(0.05)
    # DDP over 16 GPUs spans 2 nodes: all-reduce of 4 GB fp32 grads x 2 x 15/16 at the 50 GB/s inter-node cap
    q = sm.predict(W, sm.Layout(dp_mode="ddp", overlap=0.8), 16, bw)
    assert q["dp_comm_s"] == pytest.approx(0.15) and q["step_s"] == pytest.approx(0.15)
    with pytest.raises(ValueError, match="TP x CP x PP"):
        sm.predict(W, sm.Layout(tp=4), 2, bw)


def test_hsdp_shards_within_a_node_and_all_reduces_across():
    bw = sm.Bandwidth(flat=100.0, inter=50.0, gpus_per_node=8)
    fsdp = sm.predict(W, sm.Layout(overlap=0.8), 16, bw)  # one shard group over 2 nodes: all at 50 GB/s
    assert fsdp["dp_comm_s"] == pytest.approx(2 * 2e9 * 15 / 16 / 50e9 + 4e9 * 15 / 16 / 50e9)
    hsdp = sm.predict(W, sm.Layout(dp_mode="hsdp", overlap=0.8), 16, bw)  # 8 within a node, 2 replicas across
    assert hsdp["dp_comm_s"] == pytest.approx(2 * 2e9 * 7 / 8 / 100e9 + 4e9 * 7 / 8 / 100e9 + 4e9 / 8 / 50e9)
    assert sm.predict(W, sm.Layout(dp_mode="hsdp"), 8, bw)["dp_comm_s"] == pytest.approx(
        sm.predict(W, sm.Layout(), 8, bw)["dp_comm_s"])  # within one node HSDP is FSDP
    with pytest.raises(ValueError, match="shard groups"):
        sm.predict(W, sm.Layout(dp_mode="hsdp"), 12, bw)


def test_a_baseline_of_fewer_layers_is_scaled_by_flops(tmp_path, capsys):
    import dataclasses

    deep = dataclasses.replace(W, layers=70, analytic_flops=7e12)
    s = sm.scaled_to(deep, dataclasses.replace(W, analytic_flops=1e12))  # measured: 0.1 s, 1e14 model FLOPs
    assert s.step_s == pytest.approx(0.7) and s.flops == pytest.approx(7e14) and s.layers == 70
    # through the CLI: a one-layer quickstart measured, the two-layer one predicted (the embedding and head stay)
    base = tmp_path / "one_layer.json"
    base.write_text(json.dumps({"results": [{"nprocs": 1, "step_s": 0.2, "model_tflops": 1.0, "mfu": 0.5}]}))
    check = tmp_path / "two_layers_n2.json"  # measured at N=2 only: its efficiency is against the scaled baseline
    check.write_text(json.dumps({"results": [{"nprocs": 2, "step_s": 0.4, "mfu": 0.3}]}))
    argv = ["--factory", "quickstart", "--set", "model.num_layers=2", "--baseline", str(base), "--baseline-set",
            "model.num_layers=1", "--intra-busbw", "100", "--check", str(check)]
    assert sm.main(argv) == 0
    out = capsys.readouterr().out
    t1 = float(out.split("T1=")[1].split(" ms")[0])
    assert 200 * 1.5 < t1 < 200 * 2  # more than 1.5x, less than 2x: the blocks double, the rest does not
    measured = out.strip().splitlines()[-1].split("|")[1].split()
    assert measured == ["400.0", "30.0%", f"{100 * t1 / 400:.1f}%"]


def test_bandwidth_interpolates_in_log_size():
    rows = [{"op": "all_reduce", "bytes": 2**20, "busbw_GBps": 10.0},
            {"op": "all_reduce", "bytes": 2**22, "busbw_GBps": 30.0}]
    bw = sm.Bandwidth(rows)
    assert bw.busbw("all_reduce", 2**21, False) == pytest.approx(20.0)
    assert bw.busbw("all_reduce", 1, False) == 10.0 and bw.busbw("all_reduce", 2**30, False) == 30.0
    assert bw.busbw("all_reduce", 2**30, True) == 30.0  # under the 50 GB/s inter-node default
    with pytest.raises(ValueError, match="--comm"):
        bw.busbw("all_gather", 2**20, False)
