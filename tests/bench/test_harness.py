"""The benchmark harness (bench/harness.py) on the CPU: the one reader of perf.jsonl and its one step time, the
user's command run on the quickstart recipe, the peak table shared with the step log, the process-group
bookkeeping of multi-process runs, and the result files."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import harness

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.num_layers=2", "model.hidden_size=64", "data.num_clips=16", "data.batch_size=2"]


def _perf(path: Path, rows: list[dict]) -> Path:
    base = {"steps": 5, "samples_per_s": 10.0, "tokens_per_s_per_gpu": 100.0}
    path.write_text("".join(json.dumps({**base, **r}) + "\n" for r in rows))
    return path


def test_step_time_is_the_median_after_the_warm_up_intervals(tmp_path):
    # five intervals of 5 steps: the first (compilation) is dropped, the median of the rest is the step time
    perf = _perf(tmp_path / "perf.jsonl", [
        {"step": 5, "step_time_s": 9.0, "startup_s": 3.5, "peak_mem_gib": 2.0},
        {"step": 10, "step_time_s": 0.50, "peak_mem_gib": 4.0},
        {"step": 15, "step_time_s": 0.70, "mfu": 0.3, "model_tflops_per_gpu": 300.0},
        {"step": 20, "step_time_s": 0.60, "mfu": 0.5, "model_tflops_per_gpu": 500.0},
        {"step": 25, "step_time_s": 0.55, "peak_mem_gib": 3.0}])
    r = harness.read_perf(perf, skip=1)
    assert r["step_s"] == pytest.approx(0.575)  # median of 0.50, 0.70, 0.60, 0.55
    assert r["step_s"] == harness.step_time([9.0, 0.5, 0.7, 0.6, 0.55], skip=1)
    assert r["intervals"] == 4 and r["steps_timed"] == 20 and r["startup_s"] == 3.5
    assert r["peak_mem_gib"] == 4.0  # of every interval, the warm-up one too
    assert r["mfu"] == pytest.approx(0.4) and r["model_tflops"] == pytest.approx(400.0)
    assert r["last_logged_step"] == 25
    assert harness.read_perf(perf, skip=0)["step_s"] == pytest.approx(0.6)
    assert harness.read_perf(perf, skip=1, max_step=15)["step_s"] == pytest.approx(0.6)  # profiled steps left out
    assert harness.read_perf(perf, skip=1, after_step=10)["step_s"] == pytest.approx(0.575)  # a resumed run's rows
    assert harness.read_perf(perf, skip=9)["step_s"] == 0.55  # all warm-up: the last interval


def test_a_row_cut_short_by_a_killed_run_is_left_out(tmp_path):
    perf = _perf(tmp_path / "perf.jsonl", [{"step": 5, "step_time_s": 1.0}, {"step": 10, "step_time_s": 0.5}])
    perf.write_text(perf.read_text() + '{"step": 15, "step_ti')
    assert [r["step"] for r in harness.perf_rows(perf)] == [5, 10]
    with pytest.raises(RuntimeError, match="no rows"):
        harness.read_perf(perf, skip=0, after_step=10)
    with pytest.raises(ValueError, match="no timed samples"):
        harness.step_time([])


def test_one_peak_table_shared_with_the_step_log():
    from nemo_vfm.lightning import throughput
    from nemo_vfm.models import flops

    assert harness.peak_tflops is flops.peak_tflops and harness.mfu is flops.mfu
    assert harness.peak_tflops("NVIDIA H100 80GB HBM3") == flops.PEAK_BF16_TFLOPS["H100"]
    assert harness.device_peak("cpu") is None
    assert "peak_tflops" in Path(throughput.__file__).read_text()  # the step log's MFU reads the same function
    # no peak figure written anywhere in bench/: MFU there comes from the library's table
    for path in (ROOT / "bench").glob("*.py"):
        text = path.read_text()
        assert "989" not in text, path.name


def test_run_the_users_command_on_the_quickstart_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    case = harness.RecipeCase(name="qs", factory="quickstart", overrides=TINY)
    r = harness.run_recipe(case, steps=4, every=2, skip=1, device="cpu")
    assert "error" not in r, r.get("error")
    assert r["command"].startswith("launchers/train.py --factory quickstart --yes model.num_layers=2")
    assert "trainer.max_steps=4" in r["command"] and "log.root=TMP" in r["command"]
    assert r["step_s"] > 0 and r["intervals"] == 1 and r["steps_timed"] == 2 and 0 < r["startup_s"] < r["wall_s"]
    assert r["mfu"] is None  # no peak for a CPU
    bad = harness.run_recipe(harness.RecipeCase(name="bad", factory="quickstart", overrides=["model.bogus=1"]),
                             steps=1, every=1, skip=0, device="cpu")
    assert bad["error"].startswith("exit ") and "step_s" not in bad


def test_commands_and_bookkeeping(tmp_path):
    case = harness.RecipeCase(name="c", factory="pretrain_xl", overrides=["data.batch_size=4"])
    cmd = harness.launcher_cmd(case, tmp_path, steps=10, every=5, device="cpu")
    assert cmd[:6] == [sys.executable, str(ROOT / "launchers" / "train.py"), "--factory", "pretrain_xl", "--yes",
                       "data.batch_size=4"]
    assert {"trainer.max_steps=10", "trainer.log_every_n_steps=5", f"log.root={tmp_path}", "log.name=c",
            "trainer.final_checkpoint=false", "trainer.accelerator=cpu"} <= set(cmd)
    kept = harness.bookkeeping("c", tmp_path, 10, 5, "cuda", checkpoint_every=10)
    assert "trainer.checkpoint_every_n_steps=10" in kept and "trainer.final_checkpoint=false" not in kept
    assert harness.torchrun_cmd(2, ["x.py"])[1:] == ["-m", "torch.distributed.run", "--standalone",
                                                     "--nproc-per-node", "2", "x.py"]
    env = harness.child_env(1, "cpu")
    assert env == harness.NO_MULTICAST


def test_load_recipe_applies_overrides():
    recipe = harness.load_recipe("quickstart", ["model.num_layers=3", "trainer.max_steps=7"])
    assert recipe.model.num_layers == 3 and recipe.trainer.max_steps == 7


def test_results_json_and_figure(tmp_path):
    env = harness.environment("cpu", "abc")
    assert env["device"] == "cpu" and env["commit"] == "abc" and env["date"] and env["torch"] and "command" in env
    out = tmp_path / "sub" / "r.json"
    harness.write_json(out, env, [{"name": "a", "step_s": 0.5}])
    d = json.loads(out.read_text())
    assert d["commit"] == "abc" and d["results"] == [{"name": "a", "step_s": 0.5}]
    fig, ax = harness.pyplot().subplots()
    ax.plot([1, 2], [3, 4])
    assert harness.save_figure(fig, tmp_path / "f" / "x.png").stat().st_size > 0


def test_scripts_run_from_the_checkout_and_as_a_package():
    for cmd in ([sys.executable, "bench/scaling.py", "--help"], [sys.executable, "-m", "bench.scaling", "--help"]):
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 0 and "--nprocs" in r.stdout, r.stderr[-2000:]


def test_outcome_keeps_the_intervals_logged_before_a_timeout(tmp_path):
    perf = tmp_path / "perf.jsonl"
    row = {"step_time_s": 0.5, "steps": 5, "tokens_per_s_per_gpu": 100.0}
    perf.write_text("\n".join(json.dumps({**row, "step_time_s": t}) for t in (9.0, 0.5, 0.7)) + "\n")
    ok = harness.outcome(0, perf, 1, ["step 5"])
    assert ok["step_s"] == pytest.approx(0.6) and "note" not in ok and "error" not in ok
    late = harness.outcome("timeout after 9 s", perf, 1, ["step 15", "training finished"])
    assert late["step_s"] == pytest.approx(0.6) and late["note"].startswith("timeout after 9 s")
    assert harness.outcome("timeout after 9 s", perf, 3, [])["error"].endswith("all warm-up")
    assert harness.outcome(1, perf, 1, ["Traceback"])["error"] == "exit 1"
    assert harness.outcome(0, tmp_path / "none.jsonl", 1, [])["error"] == "no perf.jsonl"


def test_a_killed_run_leaves_no_process_behind(tmp_path):
    """A run past its limit is killed with everything it started (a torchrun's ranks, their workers), and
    run_logged returns only when none is alive, so that the next run does not meet its GPU memory."""
    log = tmp_path / "run.log"
    cmd = ["sh", "-c", "echo group $$; sleep 60 & sleep 60 & echo started; wait"]
    rc = harness.run_logged(cmd, {}, log, timeout=1.0, settle=10.0)
    assert rc == "timeout after 1.0 s"
    text = log.read_text()
    assert "started" in text
    pgid = int(text.split()[1])
    assert harness.live_members(pgid) == []


def test_group_members_are_found_and_killed():
    p = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(harness.live_members(p.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(harness.live_members(p.pid)) == 3  # the shell and its two sleeps
        assert harness.wait_group_gone(p.pid, 10.0)
        assert harness.live_members(p.pid) == []
    finally:
        p.kill()
        p.wait()
