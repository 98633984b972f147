"""CPU path of bench/wan_step.py (the GPU figures come from the device machine)."""

import json

import pytest

from bench import wan_step

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
    assert a.latent == (21, 60, 104) and a.compile and a.ac == "save_attention"
    assert wan_step.parse_args(["--mode", "infer"]).compile  # vfm generate compiles Wan on CUDA
    assert not wan_step.parse_args(["--mode", "infer", "--device", "cpu"]).compile


def test_the_default_checkpointing_is_the_recipes():
    """--ac defaults to what the recipes train with, so the benchmark measures their code path."""
    ft = pytest.importorskip("nemo_vfm_recipes.finetune")
    recipes = {("full", "t2v_1_3b"): ft.finetune_wan_1_3b, ("lora", "t2v_1_3b"): ft.lora_wan_1_3b,
               ("lora", "t2v_14b"): ft.lora_wan_14b}
    assert recipes.keys() == wan_step.RECIPE_AC.keys()
    for (mode, model), recipe in recipes.items():
        strategy = recipe().trainer.strategy
        assert strategy.activation_checkpointing == wan_step.RECIPE_AC[mode, model]
        assert strategy.compile in (True, "auto")  # compiled on CUDA
        assert wan_step.parse_args(["--mode", mode, "--model", model]).ac == strategy.activation_checkpointing


def test_sta_attention_is_ours_only(tmp_path):
    """--attention sta: our network runs sliding tile attention (a different result than dense), diffusers' stays
    dense, and the JSON says which."""
    out = tmp_path / "s.json"
    argv = ["--device", "cpu", "--tiny", "--mode", "infer", "--latent", "4,8,8", "--steps", "1", "--warmup", "1",
            "--attention", "sta", "--attention-window", "1x1x1", "--attention-tile", "2x2x2", "--out", str(out)]
    assert wan_step.main(argv) == 0
    d = json.loads(out.read_text())
    assert d["attention"] == "sta window 1x1x1 tile 2x2x2 (ours; diffusers dense)" and d["results"]["ours"]["ms"] > 0
    cfg = wan_step.wan_config(True, attention="sta", window="1x1x1", tile="2x2x2")
    assert cfg.attention == "sta" and cfg.attention_window == (1, 1, 1) and cfg.attention_tile == (2, 2, 2)
