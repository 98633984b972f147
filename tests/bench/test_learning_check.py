"""CPU paths of the GPU learning check (bench/learning_check.py): its quickstart preset is the recipe, and a
tiny run writes the loss curve and the sample metric over steps without nemo-run or fiddle."""

import json
import subprocess
import sys
from pathlib import Path

from bench import learning_check as lc

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_preset_mirrors_the_recipe():
    import fiddle as fdl

    from nemo_vfm_recipes.dit import quickstart

    recipe = quickstart()
    plain = lc.preset("quickstart")
    for key in ("model", "objective", "optim", "sampling"):
        assert fdl.build(getattr(recipe, key)) == plain[key], key
    for key in ("ema_decay", "cond_dropout", "seed"):
        assert getattr(recipe, key) == plain[key], key
    assert fdl.build(recipe.data).hparams == plain["data"].hparams
    built, mine = fdl.build(recipe.trainer), plain["trainer"]
    for f in ("max_steps", "precision", "gradient_clip_val", "accumulate_grad_batches"):
        assert getattr(built, f) == getattr(mine, f), f


def test_tiny_cpu_run_writes_json_and_png_without_nemo_run(tmp_path):
    out = tmp_path / "lc"
    code = (f"import sys; sys.argv = ['learning_check.py']; "
            "from bench import learning_check as lc; "
            f"rc = lc.main(['--preset', 'quickstart', '--steps', '2', '--eval-every', '1', '--device', 'cpu', "
            f"'--out', {str(out)!r}, '--set', 'data.num_clips=8', '--set', 'data.batch_size=4', "
            "'--set', 'sampling.num_samples=2', '--set', 'sampling.num_steps=2', '--set', 'model.num_layers=1', "
            "'--set', 'trainer.log_every_n_steps=1']); "
            "assert 'nemo_run' not in sys.modules and 'fiddle' not in sys.modules, 'imported nemo_run/fiddle'; "
            "print('RC', rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "RC 1" in r.stdout  # a 2-step model does not reach the goal: the check says so in its exit code
    d = json.loads((out / "learning_check.json").read_text())
    assert d["device"] == "cpu" and d["steps"] == 2 and d["date"] and d["commit"] and d["step_time_s_median"] > 0
    assert [row["step"] for row in d["loss"]] == [1, 2]
    assert [e["step"] for e in d["evals"]] == [1, 2]
    assert all(0 <= e["samples/pass_rate"] <= 1 for e in d["evals"]) and d["reached"] is False
    assert (out / "learning_check.png").stat().st_size > 0


def test_gpu_preset_fits_its_data():
    from nemo_vfm.train import validate

    cfg = lc.preset("gpu")
    validate(cfg["model"], cfg["data"])  # channels, patch divisibility, text width
    assert cfg["data"].latent_shape == (12, 16, 32, 32) and cfg["trainer"].accelerator == "gpu"


def test_set_rejects_unknown_fields():
    import pytest

    cfg = lc.preset("quickstart")
    lc._set(cfg, "objective.p_mean=-0.5")
    assert cfg["objective"].p_mean == -0.5
    with pytest.raises(ValueError, match="no field 'bogus'"):
        lc._set(cfg, "objective.bogus=1")
    with pytest.raises(ValueError, match="no section"):
        lc._set(cfg, "nope.x=1")


def test_compare_plots_the_losses_of_finished_runs(tmp_path):
    for name, scale in (("a", 1.0), ("b", 2.0)):
        (tmp_path / name).mkdir()
        rows = [{"step": s, "loss": scale / s} for s in range(1, 51)] + [{"step": 50, "samples/pass_rate": 1.0}]
        (tmp_path / name / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "cmp.png"
    assert lc.main(["--compare", f"dense={tmp_path / 'a'}", f"sta={tmp_path / 'b'}", "--out", str(out)]) == 0
    assert out.stat().st_size > 0
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "metrics.jsonl").write_text(json.dumps({"step": 1, "samples/pass_rate": 0.5}) + "\n")
    import pytest

    with pytest.raises(ValueError, match="no loss rows"):
        lc.compare_losses({"x": tmp_path / "c"}, tmp_path / "x.png")


def test_compare_reads_a_result_folder(tmp_path):
    """A folder under bench/results holds learning_check.json (its losses), not the run's metrics.jsonl."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "learning_check.json").write_text(json.dumps({"loss": [{"step": s, "loss": 1 / s} for s in range(1, 9)]}))
    out = lc.compare_losses({"r": tmp_path / "r"}, tmp_path / "r.png", window=4)
    assert out.stat().st_size > 0


def test_lora_from_a_finished_run_with_an_fp8_base(tmp_path):
    """The FP8-base check of issue 27 at CPU size: a base run, then LoRA from its checkpoint with the frozen base in
    FP8 (bf16 autocast); only the adapters train."""
    tiny = ["--preset", "quickstart", "--steps", "2", "--eval-every", "2", "--device", "cpu", "--set", "data.num_clips=8",
            "--set", "data.batch_size=4", "--set", "sampling.num_samples=2", "--set", "sampling.num_steps=2",
            "--set", "model.num_layers=1", "--set", "trainer.log_every_n_steps=1"]
    assert lc.main([*tiny, "--out", str(tmp_path / "base")]) == 1
    lora = ["--set", f"init_from={tmp_path / 'base' / 'run'}", "--set", "lora.rank=4", "--set", "lora.frozen_dtype=fp8",
            "--set", "trainer.precision=bf16-mixed"]
    assert lc.main([*tiny, *lora, "--out", str(tmp_path / "fp8")]) == 1
    d = json.loads((tmp_path / "fp8" / "learning_check.json").read_text())
    assert "frozen_dtype='fp8'" in d["config"]["lora"] and [r["step"] for r in d["loss"]] == [1, 2]
    from nemo_vfm.inference.checkpoint import raw_state_dict, read_checkpoint_info

    state = raw_state_dict(read_checkpoint_info(tmp_path / "fp8" / "run"))
    assert any(".lora_A." in k for k in state) and any(v.dtype.is_floating_point is False for k, v in state.items()
                                                        if k.endswith(".base.weight"))  # e4m3 bits (uint8)


def test_losses_are_kept_as_means_of_each_log_interval(tmp_path):
    rows = [{"step": s, "loss": float(s)} for s in range(1, 8)]
    assert lc.loss_means(rows, 3) == [{"step": 3, "loss": 2.0}, {"step": 6, "loss": 5.0}, {"step": 7, "loss": 7.0}]
    assert lc.loss_means(rows[:2], 1) == rows[:2]
    # a summarised result folder (bench/results: means of 50 steps) plots with the same smoothing in steps
    (tmp_path / "s").mkdir()
    means = [{"step": 50 * k, "loss": 1 / k} for k in range(1, 11)]
    (tmp_path / "s" / "metrics_summary.json").write_text(json.dumps({"loss_every": 50, "loss": means}))
    assert lc.compare_losses({"s": tmp_path / "s"}, tmp_path / "s.png", window=100).stat().st_size > 0


def test_set_turns_distillation_on_and_betas_become_floats():
    from nemo_vfm.lightning.distill_module import DistillConfig

    cfg = lc.preset("gpu")
    assert cfg["distill"] is None
    lc._set(cfg, "distill.num_steps=4")
    lc._set(cfg, "distill.teacher_guidance=3")
    lc._set(cfg, "optim.betas=[0,0.999]")
    assert cfg["distill"] == DistillConfig(num_steps=4, teacher_guidance=3)
    assert cfg["optim"].betas == (0.0, 0.999) and all(type(b) is float for b in cfg["optim"].betas)
    import pytest

    from nemo_vfm.lightning.module import OptimConfig

    with pytest.raises(ValueError, match="two numbers"):
        OptimConfig(betas=(0.9,))


def test_a_stopped_run_keeps_its_summary_and_a_folder_can_be_summarised(tmp_path, monkeypatch):
    """A run stopped before its last step (a time limit) still writes learning_check.json, marked not completed;
    ``--from-run`` writes the summary of a run folder that has none (a run killed outright)."""
    import lightning.pytorch as pl
    import pytest

    import nemo_vfm.train as train_module

    class StopAfterTwo(pl.Callback):  # what a SIGTERM does under Lightning: the run ends in an exception
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step >= 2:
                raise SystemExit(1)

    real_train = train_module.train

    def train_then_stop(**cfg):
        cfg["trainer"].callbacks = [StopAfterTwo()]
        return real_train(**cfg)

    monkeypatch.setattr(train_module, "train", train_then_stop)
    tiny = ["--preset", "quickstart", "--steps", "3", "--eval-every", "1", "--device", "cpu", "--set",
            "data.num_clips=8", "--set", "data.batch_size=4", "--set", "sampling.num_samples=2", "--set",
            "sampling.num_steps=2", "--set", "model.num_layers=1", "--set", "trainer.log_every_n_steps=1"]
    with pytest.raises(SystemExit):
        lc.main([*tiny, "--out", str(tmp_path / "stopped")])
    d = json.loads((tmp_path / "stopped" / "learning_check.json").read_text())
    assert d["completed"] is False and d["steps"] == 2 and d["steps_planned"] == 3 and d["device"] == "cpu"
    assert [e["step"] for e in d["evals"]][:1] == [1]

    (tmp_path / "stopped" / "learning_check.json").unlink()
    rc = lc.main(["--from-run", str(tmp_path / "stopped" / "run"), "--preset", "quickstart", "--goal", "0",
                  "--device-name", "NVIDIA H200", "--commit", "abc1234"])
    s = json.loads((tmp_path / "stopped" / "learning_check.json").read_text())
    assert rc == 0 and s["reached"] is True and s["device"] == "NVIDIA H200" and s["commit"] == "abc1234"
    assert s["torch"] == "not recorded" and s["steps"] == 2 and s["steps_planned"] == 3 and s["completed"] is False
    assert s["evals"] == d["evals"] and s["loss"] == d["loss"] and s["loss_every"] == 1
    assert (tmp_path / "stopped" / "learning_check.png").stat().st_size > 0
