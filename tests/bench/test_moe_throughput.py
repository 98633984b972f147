"""bench/moe_throughput.py on the CPU: the one-process cases (grouped, loop, dense) and the EP2 run under
two gloo processes, with the JSON they write."""

import json
import sys
from pathlib import Path

import pytest

from bench import moe_throughput as mt

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))


def test_tiny_cpu_cases_write_json(tmp_path):
    out = tmp_path / "moe.json"
    assert mt.main(["--device", "cpu", "--tiny", "--steps", "2", "--warmup", "1", "--commit", "abc",
                    "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["device"] == "cpu" and d["commit"] == "abc" and d["world_size"] == 1
    r = {x["name"]: x for x in d["results"]}
    assert set(r) == {"moe_grouped", "moe_loop", "dense"}
    for x in r.values():
        assert x["tokens_per_s"] == pytest.approx(x["batch"] * x["tokens_per_sample"] / x["step_s"])
    # same active parameters (tiny: 4 experts x 64 at capacity factor 2 = the dense FFN 128), plus the router
    assert r["moe_grouped"]["active_params"] == pytest.approx(r["dense"]["params"], rel=0.02)
    assert r["moe_grouped"]["params"] > r["dense"]["params"]
    assert r["moe_grouped"]["router"]["moe/max_load"] == 1.0 and "router" not in r["dense"]
    # the grouped and loop cases train the same network from the same seed
    assert r["moe_grouped"]["losses"] == pytest.approx(r["moe_loop"]["losses"], rel=1e-4)


def _ep_worker(rank, world, out):
    return mt.main(["--device", "cpu", "--tiny", "--steps", "1", "--warmup", "1", "--out", out])


def test_ep2_under_two_processes(tmp_path):
    from gloo_launcher import run_distributed

    out = tmp_path / "ep.json"
    assert run_distributed(_ep_worker, 2, str(out)) == [0, 0]
    d = json.loads(out.read_text())
    r = {x["name"]: x for x in d["results"]}
    assert d["world_size"] == 2 and set(r) == {"moe_ep2", "moe_fsdp2", "dense_fsdp2"}
    assert r["moe_ep2"]["ep"] == 2 and r["moe_ep2"]["tokens_per_s_per_gpu"] > 0
    # EP and plain FSDP train the same MoE: same losses
    assert r["moe_ep2"]["losses"] == pytest.approx(r["moe_fsdp2"]["losses"], rel=1e-4)
