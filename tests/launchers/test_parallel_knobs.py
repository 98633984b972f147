"""``trainer.strategy.<knob>=...`` on every factory (CLI and Python), the README's parallel examples, 2-process
gloo runs of the quickstart with TP2 and CP2 through ``torchrun launchers/train.py`` with its defaults, and one
run resumed across process counts."""

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

from nemo_vfm.lightning.callbacks import read_metrics  # noqa: E402
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
        assert built.config.layout["tp"] == 2 and built.config.layout["cp"] == 2, name


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


def _torchrun(nproc: int, *overrides: str) -> str:
    # not the rendezvous of this test process (in-process trainings of earlier tests leave MASTER_PORT set)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)] if nproc > 1
           else [sys.executable])  # --standalone: a free rendezvous port, not the default 29500
    r = subprocess.run([*cmd, str(ROOT / "launchers" / "train.py"), "--factory", "quickstart", "--yes", *overrides],
                       capture_output=True, text=True, timeout=300, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    return out


def _finished_with_previews(out: str, run: Path, step: int) -> None:
    assert "training finished" in out and f"step={step}" in out
    assert (run / "checkpoints" / f"step={step:08d}.ckpt" / ".metadata").exists()
    assert (run / "samples" / f"step={step:08d}.gif").exists() and (run / "samples" / f"step={step:08d}.json").exists()


def test_quickstart_cp2_under_torchrun_with_defaults_finishes(tmp_path):
    """The README's command with its defaults (sampling previews on): every rank takes part in sampling through
    the CP network, so the run finishes (it used to hang with rank 0 sampling and rank 1 in a barrier)."""
    out = _torchrun(2, "trainer.strategy.context_parallel_size=2", "trainer.max_steps=2", f"log.root={tmp_path}")
    _finished_with_previews(out, tmp_path / "quickstart", 2)


def test_resume_across_process_counts_and_tp2_with_defaults(tmp_path):
    """1 process (a checkpoint file) -> 2 processes with TP2 and the README's defaults (resumes it, samples its
    previews on both ranks, finishes, writes a sharded folder) -> 1 process again (resumes the folder): the
    checkpoint format does not tie a run to its process count."""
    small = ["sampling.num_samples=2", "sampling.num_steps=2"]
    _torchrun(1, "trainer.max_steps=2", f"log.root={tmp_path}", *small)
    out = _torchrun(2, "trainer.strategy.tensor_model_parallel_size=2", "trainer.max_steps=4", f"log.root={tmp_path}")
    assert "resuming from" in out and "step=00000002.ckpt" in out
    _finished_with_previews(out, tmp_path / "quickstart", 4)
    out = _torchrun(1, "trainer.max_steps=5", f"log.root={tmp_path}", *small)
    assert "resuming from" in out and "step=00000004.ckpt is a sharded checkpoint" in out
    steps = [r["step"] for r in read_metrics(tmp_path / "quickstart" / "metrics.jsonl") if "loss" in r]
    assert steps == [1, 2, 3, 4, 5], steps
