"""CPU path of ``bench/wan_step.py --mode lora`` (the GPU figures come from the device machine)."""

import json

import pytest

from bench import wan_step

pytest.importorskip("diffusers")
pytest.importorskip("peft")


def test_tiny_cpu_lora_run_writes_json(tmp_path):
    out = tmp_path / "r.json"
    assert wan_step.main(["--device", "cpu", "--tiny", "--mode", "lora", "--lora-rank", "4", "--steps", "1",
                          "--warmup", "1", "--commit", "abc", "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["mode"] == "lora" and d["lora_rank"] == 4 and d["results"]["ours"]["ms"] > 0
    # the same adapters on both sides: 10 linears per block, rank x (in + out) each
    assert d["trainable_params"] == d["trainable_params_diffusers"] > 0


def test_14b_lora_command_parses():
    a = wan_step.parse_args(["--mode", "lora", "--model", "t2v_14b", "--cases", "ours"])
    assert a.model == "t2v_14b" and a.cases == ["ours"] and a.latent == (21, 60, 104) and a.compile
    cfg = wan_step.wan_config(False, "t2v_14b")
    assert cfg.num_layers == 40 and cfg.hidden_size == 5120
