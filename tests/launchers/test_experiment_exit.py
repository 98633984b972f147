"""``launchers/experiment.py`` waits for its steps and exits non-zero when one failed."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_failed_train_step_exits_nonzero(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / '.pyshim'}", "OMP_NUM_THREADS": "1",
           "NEMORUN_HOME": str(tmp_path / "nemorun"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # torchrun
    # optim.lr=-1 passes the launcher (a plain override) and fails inside the train step
    p = subprocess.run([sys.executable, str(ROOT / "launchers" / "experiment.py"), "--workdir", str(tmp_path / "w"),
                        "--steps", "train", "optim.lr=-1", "trainer.max_steps=1"],
                       env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 1, (p.stdout + p.stderr)[-3000:]
    assert "error: step(s) train (FAILED) did not succeed" in p.stderr


def test_overrides_keep_the_memory_knobs_they_set():
    """As on ``launchers/train.py``'s command line: a memory knob the experiment's overrides set stays as set under
    the recipe's memory budget; the other overrides add nothing to the kept list."""
    sys.path.insert(0, str(ROOT / "launchers"))
    from experiment import _apply

    from nemo_vfm_recipes import dit

    recipe = _apply(dit.pretrain_7b(), ["trainer.strategy.activation_checkpointing=full", "trainer.max_steps=2"])
    assert recipe.trainer.memory_budget_keep == ("optim_name", "activation_checkpointing")
    assert recipe.trainer.strategy.activation_checkpointing == "full" and recipe.trainer.max_steps == 2
    assert _apply(dit.pretrain_7b(), ["trainer.max_steps=2"]).trainer.memory_budget_keep == ("optim_name",)
