"""launchers/train.py: the NeMo-Run CLI entry, run as a user would (subprocesses)."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def launch(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, str(ROOT / "launchers" / "train.py"), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("factory, hidden", [("pretrain_xl", "hidden_size=1152"), ("pretrain_7b", "hidden_size=4096")])
def test_dryrun_prints_resolved_config(factory, hidden):
    r = launch("--factory", factory, "--yes", "--dryrun")
    assert r.returncode == 0, r.stderr[-2000:]
    assert hidden in r.stdout and "Dry run" in r.stdout


def test_dryrun_with_pipeline_parallel_overrides():
    r = launch("--factory", "pretrain_28b", "--yes", "--dryrun", "trainer.strategy.pipeline_model_parallel_size=2",
               "trainer.strategy.pipeline_schedule=interleaved")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "pipeline_model_parallel_size=2" in r.stdout and "Dry run" in r.stdout


def test_unknown_factory_exits_nonzero():
    r = launch("--factory", "nope", "--yes")
    assert r.returncode != 0
    assert "unknown factory 'nope'" in r.stderr and "quickstart" in r.stderr


def test_bad_override_exits_nonzero_and_names_it():
    r = launch("--factory", "quickstart", "--yes", "trainer.max_steps=3", "model.bogus=1")
    assert r.returncode != 0
    assert "bogus" in r.stdout + r.stderr


def test_quickstart_trains_and_vfm_generate_samples(tmp_path):
    r = launch("--factory", "quickstart", "--yes", "trainer.max_steps=2", "data.num_clips=16", "data.batch_size=4",
               "sampling.num_steps=2", "sampling.num_samples=2", f"log.root={tmp_path}", "trainer.log_every_n_steps=1")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    exp = tmp_path / "quickstart"
    assert (exp / "checkpoints" / "step=00000002.ckpt").exists()
    assert (exp / "loss_curve.png").stat().st_size > 0 and (exp / "config.yaml").exists()
    assert (exp / "samples" / "step=00000002.mp4").stat().st_size > 0
    assert "tokens/s/gpu" in r.stdout + r.stderr

    g = subprocess.run([sys.executable, "-m", "nemo_vfm.cli.main", "generate", "--ckpt", str(exp), "--prompt",
                        "a red circle moving left on a black background", "--prompt", "a blue square moving up",
                        "--steps", "2", "--out", str(tmp_path / "gen"), "--device", "cpu"],
                       capture_output=True, text=True, timeout=300)
    assert g.returncode == 0, g.stderr[-3000:]
    from nemo_vfm.io.video import read_video

    frames, fps = read_video(tmp_path / "gen" / "batch000.mp4")
    assert frames.shape[0] == 8 and fps == 8.0
    assert (tmp_path / "gen" / "batch000.gif").exists()
    assert "blue square" in (tmp_path / "gen" / "batch000.txt").read_text()


def test_vfm_train_forwards_to_the_launcher(tmp_path):
    vfm = [sys.executable, "-m", "nemo_vfm.cli.main", "train"]
    r = subprocess.run([*vfm, "--factory", "quickstart", "--yes", "--dryrun"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and "Dry run" in r.stdout, (r.stdout + r.stderr)[-2000:]
    assert subprocess.run([*vfm, "--factory", "nope"], capture_output=True, text=True, timeout=300).returncode != 0


def test_one_process_unless_a_launcher_started_more(monkeypatch, capsys):
    """README: `python launchers/train.py` is one process, also on a multi-GPU host (Lightning's devices="auto" would
    start one per visible GPU); under torchrun the launcher's count is used."""
    import torch

    from nemo_vfm.train import _devices

    for var in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert _devices("auto", rank=0) == 1
    assert "one process on 1 of the 2 visible GPUs; to use them all: torchrun --nproc-per-node 2" in capsys.readouterr().out
    assert _devices(4, rank=0) == 4  # an explicit count stays
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert _devices("auto", rank=0) == 2 and _devices(1, rank=0) == 2


def test_profile_steps_profile_a_window_of_the_users_run(tmp_path):
    r = launch("--factory", "quickstart", "--yes", "trainer.max_steps=4", "data.num_clips=16", "data.batch_size=4",
               "sampling.num_steps=2", "sampling.num_samples=2", "trainer.profile_steps=[1,3]", f"log.root={tmp_path}")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    prof = tmp_path / "quickstart" / "profile"
    summary = json.loads((prof / "rank0.json").read_text())
    assert summary["steps"] == [2, 3] and summary["wall_ms_per_step"] > 0
    assert "gpu" not in summary  # a CPU run has no GPU kernels to split
    trace = json.loads(gzip.decompress((prof / "rank0.trace.json.gz").read_bytes()))
    assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
    assert "profile of steps 2-3" in r.stdout
    assert (tmp_path / "quickstart" / "samples" / "step=00000004.mp4").stat().st_size > 0  # previews still written


def test_a_memory_knob_set_on_the_command_line_stays_under_the_budget(tmp_path):
    """With ``trainer.memory_budget_gb`` the budget picks every memory knob, but one the user names on the command
    line stays as set: 1,000 GiB fits everything, so ``none`` would be chosen over the recipe's checkpointing."""
    common = ["--factory", "quickstart", "--yes", "trainer.max_steps=1", "data.num_clips=4", "data.batch_size=4",
              "sampling.num_steps=2", "sampling.num_samples=1", "trainer.memory_budget_gb=1000"]
    r = launch(*common, "trainer.strategy.activation_checkpointing=full", f"log.root={tmp_path / 'kept'}")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "kept as set: trainer.strategy.activation_checkpointing=full" in r.stdout
    config = (tmp_path / "kept" / "quickstart" / "config.yaml").read_text()
    assert "activation_checkpointing: full" in config
    # an explicit trainer.memory_budget_keep replaces the kept list: the budget chooses again
    r = launch(*common, "trainer.strategy.activation_checkpointing=full", "trainer.memory_budget_keep=[]",
               f"log.root={tmp_path / 'chosen'}")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert "trainer.strategy.activation_checkpointing=none" in r.stdout
    assert "activation_checkpointing: none" in (tmp_path / "chosen" / "quickstart" / "config.yaml").read_text()


def test_a_memory_knob_override_on_a_recipe_without_a_trainer_is_a_bad_override():
    """The tokenizer's recipe has no ``trainer``: ``optim.name=...`` there is nemo-run's bad-override error (exit 2),
    not a traceback from keeping it under a memory budget."""
    r = subprocess.run([sys.executable, str(ROOT / "launchers" / "train_tokenizer.py"), "--factory", "tokenizer_tiny",
                        "--yes", "--dryrun", "optim.name=adamw"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.stdout + r.stderr)[-2000:]
    assert "Invalid attribute 'optim'" in r.stdout + r.stderr and "Traceback" not in r.stderr
