"""``trainer.strategy.<knob>=...`` on every factory (CLI and Python), the README's parallel examples, and a
2-process gloo run of the quickstart with TP2 through ``torchrun launchers/train.py``."""

import os
import re
import subprocess
import sys
from pathlib import Path

import catalogue
import fiddle as fdl
from nemo_run.config import get_type_namespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "launchers"))

import train as launcher  # noqa: E402  (launchers/train.py)

from nemo_vfm.lightning.strategy import VFMParallelStrategy  # noqa: E402
from nemo_vfm.train import train  # noqa: E402


def factories() -> list[str]:
    launcher.register_recipes()
    return sorted(key[-1] for key in catalogue._get_all([get_type_namespace(train)]))


def test_every_factory_dry_runs_with_tp2_and_cp2_overrides(tmp_path, capsys):
    names = factories()
    assert {"quickstart", "pretrain_xl", "pretrain_stdit_xl", "pretrain_moviegen_1b", "pretrain_xl2_256"} <= set(names)
    for name in names:
        out_yaml = tmp_path / f"{name}.yaml"
        rc = launcher.main(["--factory", name, "--yes", "--dryrun", "trainer.strategy.tensor_model_parallel_size=2",
                            "trainer.strategy.context_parallel_size=2", "--to-yaml", str(out_yaml)])
        out = capsys.readouterr().out
        assert rc == 0, f"{name}: {out[-2000:]}"
        text = out_yaml.read_text()
        assert "tensor_model_parallel_size: 2" in text and "context_parallel_size: 2" in text, name
        assert "VFMParallelStrategy" in text, name


def test_every_factory_takes_the_knobs_in_python():
    from nemo_vfm_recipes import parallel

    for name in factories():
        recipe = catalogue._get((get_type_namespace(train), name))()
        s = parallel.strategy(recipe)
        s.tensor_model_parallel_size, s.context_parallel_size = 2, 2
        built = fdl.build(recipe.trainer.strategy)
        assert isinstance(built, VFMParallelStrategy), name
        assert built.layout["tp"] == 2 and built.layout["cp"] == 2, name


def test_unknown_knob_names_the_valid_ones(capsys):
    rc = launcher.main(["--factory", "quickstart", "--yes", "--dryrun", "trainer.strategy.tensor_parallel=2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "trainer.strategy.tensor_parallel" in err and "tensor_model_parallel_size" in err
    assert "context_parallel_size" in err


def test_readme_parallel_examples_run():
    """The Python and CLI examples of the README's Parallelism section build / dry-run as written."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Parallelism"):]
    section = section[: section.index("\n## ", 3)]
    code = re.findall(r"```python\n(.*?)```", section, re.S)
    assert code, "the README's Parallelism section has no Python example"
    for block in code:
        scope: dict = {}
        exec(block, scope)  # noqa: S102  (our own README)
        recipe = scope["recipe"]
        assert isinstance(fdl.build(recipe.trainer.strategy), VFMParallelStrategy)
    overrides = re.findall(r"`(trainer\.strategy\.[a-z_]+=[\w.]+(?: trainer\.strategy\.[a-z_]+=[\w.]+)*)`", section)
    assert overrides, "the README's Parallelism section has no CLI example"
    for line in overrides:
        rc = launcher.main(["--factory", "pretrain_7b", "--yes", "--dryrun", *line.split()])
        assert rc == 0, line


def test_quickstart_tp2_under_torchrun_gloo(tmp_path):
    """The seed's usage: ``torchrun --nproc-per-node 2 launchers/train.py --factory quickstart
    trainer.strategy.tensor_model_parallel_size=2`` trains (2 gloo processes, TP2 + SP-free)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        str(ROOT / "launchers" / "train.py"), "--factory", "quickstart", "--yes",
                        "trainer.strategy.tensor_model_parallel_size=2", "trainer.max_steps=2",
                        "trainer.log_every_n_steps=1", "model.num_layers=2", "model.hidden_size=64",
                        "data.num_clips=8", "data.batch_size=2", "sampling.enabled=false", f"log.root={tmp_path}"],
                       capture_output=True, text=True, timeout=600, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "training finished" in out and "step=2" in out
    assert (tmp_path / "quickstart" / "checkpoints" / "step=00000002.ckpt").exists()
