"""Real Slurm: a single-node cluster on this machine (Debian's slurm-wlm + munge, installed with apt-get when
missing) runs the quickstart recipe through ``run.SlurmExecutor`` + ``LocalTunnel``, the chained
curate -> prepare -> train -> generate experiment (afterok dependencies), and ``launchers/slurm/train.sbatch``.
Everything is submitted at once (the node has 2 CPUs), waited for, and the checkpoints/videos checked."""

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name, path):
    sys.path.insert(0, str(ROOT / "launchers"))
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (it installs packages and runs munged)")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        pytest.skip("slurmctld is not installed and apt-get is unavailable to install it")
    local = _load("local_cluster", ROOT / "launchers" / "slurm" / "local_cluster.py")
    pids = local.start()
    yield pids
    local.stop()
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _wait(job_ids: list[str], timeout: float = 280.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True, text=True)
        if not r.stdout.strip():
            return
        time.sleep(1.0)
    subprocess.run(["scancel", *job_ids])
    raise TimeoutError(f"Slurm jobs {job_ids} did not finish in {timeout:.0f} s")


@pytest.fixture(scope="module")
def submitted(cluster, tmp_path_factory):
    """Submit the three workloads together, wait for all of them; return their folders."""
    import nemo_run as run
    from nemo_run import config

    from nemo_vfm.curation.synthetic import make_raw_dataset
    from nemo_vfm_recipes import dit

    base = tmp_path_factory.mktemp("slurm")
    old_home, old_path, old_stdin = config.get_nemorun_home(), os.environ["PATH"], sys.stdin
    # not ".../nemo_run": without a container nemo-run rewrites every "/nemo_run" in the sbatch script
    config.set_nemorun_home(str(base / "nr_home"))
    os.environ["PATH"] = f"{Path(sys.executable).parent}:{old_path}"  # the jobs run this venv's python
    sys.stdin = open(os.devnull)  # nemo-run's shell calls (invoke) read stdin
    try:
        executors = importlib.import_module("nemo_vfm_recipes.executors")
        experiment = _load("experiment", ROOT / "launchers" / "experiment.py")
        ex = executors.slurm_executor("local", "debug", gpus_per_node=0, time="00:10:00", packager="none")
        assert ex.tunnel.job_dir == os.path.join(config.get_nemorun_home(), "experiments")

        # 1. the quickstart recipe, as a user would: run.run(recipe, executor=...)
        recipe = dit.quickstart()
        recipe.trainer.max_steps, recipe.trainer.log_every_n_steps = 2, 1
        recipe.data.num_clips, recipe.data.batch_size = 16, 4
        recipe.sampling.enabled, recipe.log.root = False, str(base / "quickstart_runs")
        run.run(recipe, executor=executors.clone(ex), name="quickstart", detach=True)

        # 2. the sbatch script (no NeMo-Run on the submitting side)
        sb = subprocess.run(
            ["sbatch", "--parsable", "--account=local", f"--output={base}/sbatch-%j.out",
             f"--export=ALL,REPO={ROOT},PYTHON={sys.executable}", str(ROOT / "launchers" / "slurm" / "train.sbatch"),
             "--factory", "quickstart", "trainer.max_steps=2", "data.num_clips=16", "data.batch_size=4",
             "sampling.enabled=false", f"log.root={base / 'sbatch_runs'}", "log.name=sbatch_quickstart"],
            capture_output=True, text=True, check=True)
        sbatch_id = sb.stdout.strip().split(";")[0]

        # 3. the chained experiment on 3 small synthetic raw videos
        work = base / "pipeline"
        make_raw_dataset(work / "raw", num_videos=3, seed=0, height=72, width=128, scene_s=(1.0, 2.0),
                         scenes_per_video=(2, 3))
        tasks = experiment.build_tasks(str(work), overrides=["trainer.max_steps=2", "sampling.enabled=false",
                                                             "trainer.log_every_n_steps=1"], generate_steps=2)
        exp = experiment.build_experiment("vfm_pipeline", tasks, ex)
        try:
            exp.run(sequential=False, detach=True)
        finally:
            exp.__exit__(None, None, None)
        ids = [str(j.handle).rsplit("/", 1)[-1] for j in exp.jobs]  # slurm_tunnel://nemo_run/<job id>
        assert all(i.isdigit() for i in ids), ids
        queued = subprocess.run(["squeue", "-h", "-o", "%i %E", "-j", ids[1]], capture_output=True, text=True).stdout
        _wait([sbatch_id, *ids])
    finally:
        config.set_nemorun_home(old_home)
        os.environ["PATH"], sys.stdin = old_path, old_stdin
    return {"base": base, "work": work, "exp_dir": Path(exp._exp_dir), "sbatch_id": sbatch_id, "queued": queued}


def test_quickstart_through_slurm_executor_writes_checkpoint(submitted):
    ckpt = submitted["base"] / "quickstart_runs" / "quickstart" / "checkpoints" / "step=00000002.ckpt"
    logs = list((submitted["base"] / "nr_home" / "experiments").glob("quickstart/*/*/log-*.out"))
    assert ckpt.is_file(), "\n".join(p.read_text()[-3000:] for p in logs)
    assert any("training finished" in p.read_text() for p in logs)


def test_sbatch_script_trains_with_torchrun_rendezvous(submitted):
    out = (submitted["base"] / f"sbatch-{submitted['sbatch_id']}.out").read_text()
    ckpt = submitted["base"] / "sbatch_runs" / "sbatch_quickstart" / "checkpoints" / "step=00000002.ckpt"
    assert ckpt.is_file(), out[-3000:]
    assert "1 node(s) x 1 process(es), rendezvous" in out and "training finished" in out


def test_chained_experiment_runs_every_step(submitted):
    work, exp_dir = submitted["work"], submitted["exp_dir"]
    logs = {p.parent.name: p.read_text() for p in exp_dir.glob("*/sbatch_*.out")}
    assert set(logs) == {"curate", "prepare", "train", "generate"}
    assert all("job exited with code 0" in text for text in logs.values()), {k: v[-2000:] for k, v in logs.items()}
    assert "afterok" in submitted["queued"] or submitted["queued"] == ""  # prepare waited for curate
    assert list((work / "curated" / "shards").glob("*.tar")) and (work / "prepared" / ".nv-meta").is_dir()
    assert (work / "experiments" / "quickstart" / "checkpoints" / "step=00000002.ckpt").is_file()
    from nemo_vfm.io.video import read_video

    frames, _ = read_video(work / "generated" / "batch000.mp4")
    assert frames.shape[0] == 8
