"""Distillation recipes (``recipes/distill.py``): each builds and serializes with a valid DMD2 config over its
teacher's objective; ``distill_quickstart`` distils a quickstart run through ``launchers/train.py`` (the README's
command, its defaults but the step count and a smaller network) and the student's checkpoint samples its own way."""

import subprocess
import sys
from pathlib import Path

import fiddle as fdl
import nemo_run as run
import pytest

import nemo_vfm_recipes.distill as D
from nemo_vfm.train import train

ROOT = Path(__file__).resolve().parents[1]
FACTORIES = ["distill_quickstart", "distill_wan_1_3b", "distill_wan_14b", "distill_wan2_2_ti2v_5b"]
SMALL = ["model.num_layers=1", "model.hidden_size=64", "model.num_heads=2", "data.num_clips=32",
         "trainer.log_every_n_steps=1", "sampling.num_samples=2"]


@pytest.mark.parametrize("name", FACTORIES)
def test_recipe_builds_and_serializes(name):
    from nemo_run.core.serialization.yaml import YamlSerializer

    recipe = getattr(D, name)()
    assert isinstance(recipe, run.Partial) and recipe.__fn_or_cls__ is train
    doc = getattr(D, name).__doc__
    assert "CLI" in doc and "Python" in doc
    dmd = fdl.build(recipe.distill).dmd(fdl.build(recipe.objective))  # every knob valid for the teacher's objective
    assert dmd.num_steps == 4 and len(dmd.schedule()) == 4
    assert recipe.init_from or fdl.build(recipe.model).pretrained  # a teacher to distil
    assert recipe.cond_dropout == 0.0 and "distill:" in YamlSerializer().serialize(recipe)
    if name == "distill_wan_14b":
        assert recipe.lora.rank == 64 and recipe.trainer.strategy.fsdp and recipe.distill.teacher_dtype == "bf16"


def _launch(*args):
    return subprocess.run([sys.executable, str(ROOT / "launchers" / "train.py"), *args], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)


def test_distill_quickstart_distils_a_quickstart_run_and_the_student_samples_its_schedule(tmp_path, capsys):
    from nemo_vfm.cli.main import main

    root = f"log.root={tmp_path}"
    teacher = _launch("--factory", "quickstart", "--yes", root, "trainer.max_steps=2", "sampling.enabled=false",
                      *SMALL)
    assert teacher.returncode == 0, teacher.stderr[-3000:]
    student = _launch("--factory", "distill_quickstart", "--yes", root, f"init_from={tmp_path / 'quickstart'}",
                      "trainer.max_steps=3", *SMALL)
    assert student.returncode == 0, student.stderr[-3000:]
    out = tmp_path / "distill_quickstart"
    assert list(out.glob("samples/*.mp4")) or list(out.rglob("*.gif"))  # the previews, sampled as a student
    assert main(["evaluate", "--ckpt", str(out), "--num", "2", "--out", str(tmp_path / "eval")]) == 0
    printed = capsys.readouterr().out
    assert "4-step distilled student" in printed and "few-step x 4 steps, guidance 1.0" in printed
    assert main(["evaluate", "--ckpt", str(out), "--num", "2", "--steps", "24", "--out", str(tmp_path / "e2")]) == 2
    exported = tmp_path / "student.safetensors"  # the schedule travels in the export's header
    assert main(["export", "--ckpt", str(out), "--format", "safetensors", "--out", str(exported)]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--ckpt", str(exported), "--num", "2", "--out", str(tmp_path / "e3")]) == 0
    assert "4-step distilled student" in capsys.readouterr().out
