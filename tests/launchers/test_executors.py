"""nemo_vfm_recipes.executors (recipes/executors.py): argument checks before submission, CLI registration, the exact Slurm dryrun scripts."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"


def _load(name):
    sys.path.insert(0, str(ROOT / "launchers"))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "launchers" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def executors():
    import nemo_vfm_recipes.executors

    return nemo_vfm_recipes.executors


@pytest.fixture
def nemorun_home(tmp_path):
    """Point nemo-run's home (experiments, job dirs) at ``tmp_path`` (it reads $NEMORUN_HOME only at import)."""
    from nemo_run import config

    old = config.get_nemorun_home()
    config.set_nemorun_home(str(tmp_path))
    yield tmp_path
    config.set_nemorun_home(old)


@pytest.mark.parametrize("kwargs, message", [
    (dict(account=""), "account must be your Slurm account"),
    (dict(account="a", nodes=0), "nodes must be an integer >= 1"),
    (dict(account="a", gpus_per_node=-1), "gpus_per_node must be an integer >= 0"),
    (dict(account="a", time="4 hours"), "time must be a Slurm time limit"),
    (dict(account="a", tunnel="kube"), "tunnel must be 'local' or 'ssh'"),
    (dict(account="a", mounts=["/data:/data"]), "mounts need a container_image"),
    (dict(account="a", container_image="img", mounts=["data"]), "must look like '/host/path:/container/path"),
    (dict(account="a", tunnel="ssh", host="login"), "needs user, job_dir"),
    (dict(account="a", host="login"), "only apply to tunnel='ssh'"),
    (dict(account="a", packager="zip"), "packager must be 'git' or 'none'"),
])
def test_slurm_executor_rejects_bad_arguments(executors, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        executors.slurm_executor(**kwargs)


def test_slurm_executor_builds_ssh_and_local(executors, nemorun_home):
    import nemo_run as run

    ex = executors.slurm_executor("proj", "batch", nodes=4, gpus_per_node=8, container_image="nvcr.io/x:1",
                                  mounts=["/lustre:/lustre:ro"], tunnel="ssh", host="login", user="me",
                                  job_dir="/lustre/me/runs")
    assert isinstance(ex.tunnel, run.SSHTunnel) and ex.tunnel.job_dir == "/lustre/me/runs"
    assert (ex.nodes, ex.ntasks_per_node, ex.gpus_per_node, ex.launcher) == (4, 8, 8, "torchrun")
    local = executors.slurm_executor("proj", None, gpus_per_node=0, packager="none", check_partition=False)
    assert isinstance(local.tunnel, run.LocalTunnel)
    assert local.tunnel.job_dir == str(nemorun_home / "experiments")  # must equal nemo-run's experiments dir
    assert local.gpus_per_node is None and local.ntasks_per_node == 1


def test_unknown_partition_is_rejected_with_the_known_ones(executors, monkeypatch):
    monkeypatch.setattr(executors, "slurm_partitions", lambda: ["batch", "debug"])
    with pytest.raises(ValueError, match="'nope' is not a partition of this cluster; choose one of: batch, debug"):
        executors.slurm_executor("proj", "nope")
    assert executors.slurm_executor("proj", "debug").partition == "debug"


def test_local_executor(executors):
    ex = executors.local_executor(4)
    assert (ex.ntasks_per_node, ex.launcher) == (4, "torchrun")
    with pytest.raises(ValueError, match="gpus_per_node must be an integer >= 1"):
        executors.local_executor(0)


def test_slurm_dryrun_scripts_match_golden(executors, nemorun_home, monkeypatch):
    """The exact sbatch scripts of the chained experiment (2 nodes x 8 GPUs, container, mounts)."""
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # nemo-run's shell calls (invoke) read stdin
    experiment = _load("experiment")
    ex = executors.slurm_executor("proj", "batch", nodes=2, gpus_per_node=8, container_image="nvcr.io/nvidia/pytorch:25.09-py3",
                                  mounts=["/lustre/data:/data"], time="02:00:00", tunnel="ssh", host="login.example.com",
                                  user="me", job_dir="/lustre/me/nemo_run", packager="none")
    tasks = experiment.build_tasks("/data/demo", raw="/data/raw", factory="pretrain_xl",
                                   overrides=["trainer.max_steps=100"])
    exp = experiment.build_experiment("vfm_pipeline", tasks, ex)
    try:
        exp.dryrun(log=False, delete_exp_dir=False)
        texts = experiment.print_dryrun(exp)
    finally:
        exp.__exit__(None, None, None)
    assert [j.id for j in exp.jobs] == ["curate", "prepare", "train", "generate"]
    for job, text in zip(exp.jobs, texts):
        text = re.sub(r"vfm_pipeline_\d+", "vfm_pipeline_EXPID", text).replace(str(nemorun_home), "NEMORUN_HOME")
        text = re.sub(r"--rdzv-id \d+", "--rdzv-id RDZV", text)
        golden = GOLDEN / f"slurm_{job.id}.sbatch"
        if os.environ.get("UPDATE_GOLDEN"):
            golden.write_text(text)
        assert text == golden.read_text(), job.id
    train = (GOLDEN / "slurm_train.sbatch").read_text()
    assert "#SBATCH --nodes=2" in train and "#SBATCH --gpus-per-node=8" in train
    assert "--container-image nvcr.io/nvidia/pytorch:25.09-py3" in train and "/lustre/data:/data" in train
    assert "torchrun --rdzv-backend c10d --rdzv-endpoint $head_node_ip:29500" in train
    assert "--nnodes 2 --nproc-per-node 8" in train
    gen = (GOLDEN / "slurm_generate.sbatch").read_text()
    assert "#SBATCH --nodes=1" in gen and "torchrun" not in gen


def test_cli_executor_registration_and_errors(tmp_path):
    """`run.executor=slurm` on launchers/train.py: a bad executor argument exits non-zero before submitting."""
    env = {**os.environ, "NEMORUN_HOME": str(tmp_path)}
    train = [sys.executable, str(ROOT / "launchers" / "train.py"), "--factory", "quickstart", "--yes"]
    r = subprocess.run([*train, "run.executor=slurm", "run.executor.account=proj", "run.executor.mounts=['/a:/a']"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode != 0
    assert "mounts need a container_image" in r.stdout + r.stderr
    assert not list(tmp_path.glob("experiments/*")), "nothing may be submitted"
