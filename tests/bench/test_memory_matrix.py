"""bench/memory_matrix.py on the CPU: a budget the chooser cannot meet is recorded as not fitting (not as a
failure), a fitting one trains and records s/step and the chooser's line; a Wan LoRA recipe runs on random
weights and latents through the same path."""

import argparse
import json

import pytest

from bench import memory_matrix as mm

TINY_WAN = ["model.num_layers=1", "model.hidden_size=64", "model.num_heads=2", "model.ffn_size=64",
            "model.context_dim=32", "model.text_len=8", "model.freq_dim=32", "trainer.precision=32-true",
            "trainer.strategy.compile=false"]


def test_budgets_that_fit_and_that_do_not(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "m.json"
    argv = ["--device", "cpu", "--case", "tiny=quickstart:2x8x8", "--budgets", "0.5,4", "--steps", "2", "--every",
            "1", "--set", "model.num_layers=1", "--set", "model.hidden_size=64", "--commit", "abc", "--out", str(out)]
    assert mm.main(argv) == 0
    d = json.loads(out.read_text())
    small, big = d["results"]
    assert small["error"] == "nothing fits (the chooser's estimate)" and "step_s" not in small
    assert big["error"] is None and big["step_s"] > 0 and big["chosen"][0].startswith("memory budget 4 GiB")
    assert big["last_logged_step"] == 2 and small["last_logged_step"] == 0
    assert d["commit"] == "abc" and d["emulation"] == "CPU: no memory cap"
    assert "| tiny | 0.5 | no: nothing fits" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 0

    wan = ["--device", "cpu", "--case", "wan=lora_wan_1_3b:1x4x4", "--budgets", "4", "--steps", "2", "--every", "1",
           "--out", str(tmp_path / "w.json")] + [x for o in TINY_WAN for x in ("--set", o)]
    assert mm.main(wan) == 0
    (r,) = json.loads((tmp_path / "w.json").read_text())["results"]
    assert r["error"] is None and r["step_s"] > 0
    assert "trainer.strategy.activation_checkpointing=none" in r["chosen"][0]  # the recipe's save_attention replaced


def test_case_spec_errors():
    assert mm.parse_case("a=quickstart:2x8x8") == ("a", ("quickstart", (2, 8, 8), []))
    with pytest.raises(ValueError, match="name=factory:TxHxW"):
        mm.parse_case("a=quickstart:2x8")


def test_merge_orders_rows_as_the_cases_and_keeps_each_runs_origin(tmp_path):
    def run(name, commit, rows):
        (tmp_path / name).write_text(json.dumps({"device": "GPU", "date": "2026-11-26", "commit": commit,
                                                 "results": rows}))
        return str(tmp_path / name)

    row = dict(chosen=["memory budget 80 GiB: no memory knob changed (estimated 1 GiB)"], error=None, step_s=2.0,
               peak_mem_gib=1.0, last_logged_step=4)
    a = run("a.json", "aaa", [{**row, "case": "wan14b-lora-480p", "budget_gib": 80.0},
                              {**row, "case": "wan14b-lora-480p", "budget_gib": 24.0, "error": "out of memory",
                               "step_s": None, "peak_mem_gib": None}])
    b = run("b.json", "bbb", [{**row, "case": "wan1.3b-lora-480p", "budget_gib": 48.0},
                              {**row, "case": "wan1.3b-lora-480p", "budget_gib": 32.0, "error": "timeout after 300 s",
                               "last_logged_step": 3},
                              {**row, "case": "wan1.3b-lora-480p", "budget_gib": 8.0, "error": "timeout after 300 s",
                               "last_logged_step": 1}])
    out = tmp_path / "all.json"
    assert mm.main(["--merge", a, b, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["case"], r["budget_gib"], r["commit"]) for r in rows] == [
        ("wan1.3b-lora-480p", 8.0, "bbb"), ("wan1.3b-lora-480p", 32.0, "bbb"), ("wan1.3b-lora-480p", 48.0, "bbb"),
        ("wan14b-lora-480p", 24.0, "aaa"), ("wan14b-lora-480p", 80.0, "aaa")]
    md = out.with_suffix(".md").read_text()
    assert "| wan14b-lora-480p | 24 | no: out of memory |" in md
    # cut by the harness's time limit: fits once it has logged two steps under the cap (one timed), not before
    assert "| wan1.3b-lora-480p | 32 | yes (stepped to step 3, then the 300 s limit cut it) | 2.000 |" in md
    assert "| wan1.3b-lora-480p | 8 | no: timeout after 300 s | 2.000 (until step 1) |" in md
    assert out.with_suffix(".png").stat().st_size > 0


def test_every_built_in_case_names_a_recipe_whose_patches_tile_its_latents():
    import math

    from nemo_vfm_recipes import finetune

    for name, (factory, latent, _) in mm.CASES.items():
        model = getattr(finetune, factory)().model
        assert all(n % p == 0 for n, p in zip(latent, model.patch_size)), name
    assert math.prod(n // p for n, p in zip(mm.CASES["wan2.2-5b-lora-704p"][1], (1, 2, 2))) == 27_280


def test_plan_fills_the_cells_not_run_and_names_a_run_of_the_same_settings(tmp_path):
    row = dict(error=None, peak_mem_gib=22.8, last_logged_step=4, step_s=1.75)
    measured = tmp_path / "m.json"
    ran = "trainer.strategy.activation_checkpointing_blocks=25, lora.frozen_dtype=bf16"  # the 32 GiB plan
    measured.write_text(json.dumps({"results": [
        {**row, "case": "wan1.3b-lora-480p", "budget_gib": 80.0,
         "chosen": [f"memory budget 80 GiB (estimates fit 72.0): {ran} (estimated 26.8 GiB, ...)"]},
        {**row, "case": "wan1.3b-lora-480p", "budget_gib": 24.0, "error": "out of memory", "step_s": None,
         "chosen": ["memory budget 24 GiB: lora.frozen_dtype=bf16 (estimated 15.7 GiB, ...)"]}]}))
    out = tmp_path / "plan.json"
    argv = ["--plan", "--only", "wan1.3b-lora-480p,wan14b-lora-720p", "--budgets", "24,32,80", "--measured",
            str(measured), "--out", str(out)]
    assert mm.main(argv) == 0
    plans = {(p["case"], p["budget_gib"]): p for p in json.loads(out.read_text())["plans"]}
    assert plans[("wan1.3b-lora-480p", 32.0)]["plan"] == ran
    assert plans[("wan14b-lora-720p", 24.0)]["plan"] is None  # the 14B at 720p fits no 24 GiB card (estimate)
    (lora13, lora14) = out.with_suffix(".md").read_text().splitlines()[2:]
    # a measured cell whose plan is not what ran says what the budget takes now
    assert lora13.split(" | ")[1:] == [
        "no: out of memory (now: activation_checkpointing_blocks=28, frozen_dtype=bf16; est. 20.1 GiB, x1.09, not run)",
        "plan: activation_checkpointing_blocks=25, frozen_dtype=bf16; est. 26.8 GiB, x1.08 (= the 80 GiB run: 1.75 s, "
        "peak 22.8 GiB)",
        "**1.75 s**, 22.8 GiB (now: activation_checkpointing_blocks=5, frozen_dtype=bf16; est. 71.1 GiB, x1.02, not run) |"]
    assert lora14.split(" | ")[1] == "plan: nothing fits (GPU memory)"
    assert lora14.split(" | ")[3].startswith("plan: activation_checkpointing=full, frozen_dtype=fp8; est.")


# Cells whose plan moved when the chooser began searching counts of checkpointed blocks (and counting Wan 2.2
# TI2V-5B's per-token modulation), not re-run since: what the chooser takes there now (docs/finetuning.md marks them)
NOT_RERUN = {
    ("wan1.3b-lora-720p", 80.0): "trainer.strategy.activation_checkpointing_blocks=22, lora.frozen_dtype=bf16",
    ("wan1.3b-full-720p", 80.0): "trainer.strategy.activation_checkpointing_blocks=25",
    ("wan2.2-5b-lora-704p", 80.0): "trainer.strategy.activation_checkpointing_blocks=23, lora.frozen_dtype=bf16",
    ("wan2.2-5b-full-704p", 80.0): "trainer.strategy.activation_checkpointing=save_attention, "
                                   "trainer.strategy.activation_checkpointing_blocks=22, trainer.strategy.cpu_offload=True",
}


def test_the_plans_choose_what_the_gpu_matrix_ran():
    """The chooser on this CPU picks, for every cell of the GPU matrix of the current commit series (f8f9167 on
    H100s, f27604d on an H200), the settings that ran there, or for the cells not re-run since their plan moved, the
    plan named in NOT_RERUN (a change to the estimates that moves one fails here: re-measure the matrix,
    docs/finetuning.md)."""
    rows = json.loads((mm.ROOT / "bench/results/memory_matrix_f27604d.json").read_text())["results"]
    args = argparse.Namespace(overrides=[], host_gib=240.0, torchao=False)
    checked = []
    for r in rows:
        if r["commit"] not in ("f8f9167", "f27604d"):
            continue
        plan = mm.plan_case(r["case"], mm.CASES[r["case"]], r["budget_gib"], args)
        cell = (r["case"], r["budget_gib"])
        assert plan["plan"] == NOT_RERUN.get(cell, mm.chosen_settings(r)), cell
        checked.append(cell)
    assert len(checked) == 13 and set(NOT_RERUN) <= set(checked)
