"""The benchmark harness: run a recipe as a user does, read its step log, record the result.

The scripts in ``bench/`` are tables of cases on these pieces:

- **Run** a recipe through the user's command: :func:`launcher_cmd` builds ``launchers/train.py --factory F --yes``
  with the case's overrides plus bookkeeping ones only (step count, log cadence, a run folder, no sampling previews,
  no periodic checkpoints); :func:`torchrun_cmd` wraps it in ``torchrun --standalone``. :func:`run_recipe` runs one
  case in a subprocess; :func:`run_logged` runs any command in its own session with its log in a file and leaves no
  process of it behind; :func:`outcome` turns a run's exit code, step log and ``perf.jsonl`` into figures or an
  error. :func:`load_recipe` builds a registered factory's config in this process (for profiling and planning).
- **Read** the step log: :func:`read_perf` is the one reader of ``perf.jsonl`` (the rows that
  :class:`nemo_vfm.lightning.throughput.ThroughputLogger` writes), and :func:`step_time` the one definition of step
  time (see :data:`STEP_TIME`).
- **Peak**: MFU is against :func:`nemo_vfm.models.flops.peak_tflops`, the table the step log uses (re-exported
  here as :func:`peak_tflops`; :func:`device_peak` reads it for a device).
- **Record**: :func:`environment` (device, torch, date, commit, command) and :func:`write_json` (the environment
  and the rows, one JSON); :func:`pyplot` and :func:`save_figure` for the plots beside it.

Scripts run either way: ``python bench/scaling.py ...`` (their first lines make ``bench`` importable as a package)
or ``python -m bench.scaling ...``.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nemo_vfm.models.flops import mfu, peak_tflops

__all__ = ["NO_MULTICAST", "ROOT", "STEP_TIME", "RecipeCase", "bookkeeping", "child_env", "comm_env",
           "device_peak", "environment", "git_commit", "launcher_cmd", "live_members", "load_recipe", "mfu",
           "outcome", "peak_tflops", "perf_rows", "pyplot", "rank_tail", "read_perf", "run_logged", "run_recipe",
           "save_figure", "set_override", "step_time", "torchrun_cmd", "wait_group_gone", "write_json"]

ROOT = Path(__file__).resolve().parents[1]
# the child environment of multi-GPU runs: NVLink multicast off
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
LOG_TAIL_LINES = 40

STEP_TIME = ("step time: the median of the timed samples of seconds per optimizer step, after the warm-up ones "
             "(compilation) are dropped. From a run's perf.jsonl a sample is one log interval (its step_time_s: "
             "wall time between optimizer steps over the interval, data loading included, / its steps); from a "
             "bare step timed in-process, one step.")


def step_time(seconds: Sequence[float], skip: int = 0) -> float:
    """Step time (:data:`STEP_TIME`): the median of ``seconds`` (per-step seconds of each timed sample) after the
    first ``skip`` samples; with fewer samples than that, the last one."""
    kept = list(seconds[skip:]) or list(seconds[-1:])
    if not kept:
        raise ValueError("no timed samples")
    return statistics.median(kept)


# --------------------------------------------------------------------------------------------------
# perf.jsonl


def perf_rows(path: Path) -> list[dict]:
    """The rows of a ``perf.jsonl`` (a last row cut short by a killed run left out)."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # a run killed while writing its last row
                break
            raise
    return rows


def read_perf(path: Path, skip: int, max_step: int | None = None, after_step: int = 0) -> dict:
    """A run's figures from its ``perf.jsonl``: the step time (:func:`step_time` of the log intervals after the
    first ``skip``) and the median of each other per-interval figure over the same intervals; the peak memory of
    all. Only rows with ``after_step < step <= max_step`` count (``max_step``: leave out profiled steps;
    ``after_step``: the second run of a resumed training that appends to the same file)."""
    rows = [r for r in perf_rows(path)
            if (not after_step or r["step"] > after_step) and (max_step is None or r["step"] <= max_step)]
    if not rows:
        raise RuntimeError(f"{path} has no rows")
    kept = rows[skip:] or rows[-1:]

    def med(key):
        vals = [r[key] for r in kept if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    times = [r["step_time_s"] for r in rows if r.get("step_time_s") is not None]
    return {"step_s": step_time(times, skip) if times else None, "samples_per_s": med("samples_per_s"),
            "tokens_per_s_per_gpu": med("tokens_per_s_per_gpu"), "model_tflops": med("model_tflops_per_gpu"),
            "mfu": med("mfu"), "peak_mem_gib": max((r.get("peak_mem_gib") or 0) for r in rows) or None,
            "intervals": len(kept), "steps_timed": sum(r["steps"] for r in kept),
            "startup_s": rows[0].get("startup_s"), "last_logged_step": rows[-1].get("step")}


# --------------------------------------------------------------------------------------------------
# the peak table (the library's)


def device_peak(device) -> float | None:
    """Dense bf16 peak TFLOP/s of ``device`` (a ``torch.device`` or ``"cuda"``/``"cpu"``) from the library's table;
    None on the CPU or for a GPU the table does not name."""
    import torch

    device = torch.device(device)
    return peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


# --------------------------------------------------------------------------------------------------
# running the user's command


@dataclass(kw_only=True)
class RecipeCase:
    """One ``launchers/train.py`` run of ``factory`` with ``overrides``; ``reference`` (``train_throughput.
    BenchSettings`` keywords) times the bare bench step of the same model and batch."""

    name: str
    factory: str
    overrides: list[str] = field(default_factory=list)
    reference: dict | None = None


def bookkeeping(name: str, run_root: Path, steps: int, every: int, device: str = "cuda",
                checkpoint_every: int | None = None) -> list[str]:
    """The overrides a benchmark adds to a case: nothing that changes a step."""
    extra = [f"trainer.max_steps={steps}", f"trainer.log_every_n_steps={every}", f"log.root={run_root}",
             f"log.name={name}", "log.tensorboard=false", "sampling.enabled=false",
             f"trainer.checkpoint_every_n_steps={checkpoint_every or 10 * steps}", "trainer.enable_progress_bar=false"]
    if checkpoint_every is None:
        extra.append("trainer.final_checkpoint=false")
    if device == "cpu":
        extra.append("trainer.accelerator=cpu")
    return extra


def launcher_cmd(case: RecipeCase, run_root: Path, steps: int, every: int, device: str = "cuda") -> list[str]:
    """``python launchers/train.py --factory F --yes OVERRIDES BOOKKEEPING``; the run's folder is
    ``run_root / case.name`` (its ``perf.jsonl`` inside)."""
    return [sys.executable, str(ROOT / "launchers" / "train.py"), "--factory", case.factory, "--yes",
            *case.overrides, *bookkeeping(case.name, run_root, steps, every, device)]


def torchrun_cmd(nprocs: int, args: list[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N ARGS`` (``args``: a script and its
    arguments, without the interpreter)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nprocs), *args]


def run_recipe(case: RecipeCase, steps: int, every: int, skip: int, device: str = "cuda") -> dict:
    """Run ``launchers/train.py`` for ``case`` in a subprocess and return its figures (:func:`read_perf`) or
    ``error``."""
    res = {"name": case.name, "path": "launchers/train.py", "factory": case.factory, "overrides": case.overrides}
    with tempfile.TemporaryDirectory(prefix="vfm-bench-") as tmp:
        cmd = launcher_cmd(case, Path(tmp), steps, every, device)
        res["command"] = " ".join(cmd[1:]).replace(str(ROOT) + "/", "").replace(tmp, "TMP")
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        log = (p.stdout + p.stderr).splitlines()
        res["step_log"] = [line for line in log if line.startswith("step ")][-3:]
        perf = Path(tmp) / case.name / "perf.jsonl"
        if p.returncode != 0 or not perf.exists():
            res["error"] = f"exit {p.returncode}: " + " | ".join(log[-6:])[-600:]
            return res
        res.update(read_perf(perf, skip))
        res.pop("last_logged_step")
    return res


def comm_env() -> dict[str, str]:
    """The communication settings a multi-process run sees, for its JSON: the ``NCCL_*``, ``TORCH_NCCL_*``,
    ``NVSHMEM_*`` and ``TORCH_SYMM_MEM_*`` variables of this process's environment, :data:`NO_MULTICAST` on top (as
    :func:`child_env` sets it)."""
    prefixes = ("NCCL_", "TORCH_NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_")
    return {**{k: v for k, v in sorted(os.environ.items()) if k.startswith(prefixes)}, **NO_MULTICAST}


def child_env(nprocs: int, device: str, cache_dir: Path | None = None) -> dict[str, str]:
    """What a multi-process run sets on top of this process's environment: :data:`NO_MULTICAST` and, on CUDA,
    exactly ``nprocs`` GPUs visible (the first of ``CUDA_VISIBLE_DEVICES``, else 0..N-1), so that Lightning's
    automatic device count is N; with ``cache_dir``, its own Inductor and Triton caches."""
    env = dict(NO_MULTICAST)
    if device == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            ids = [v for v in visible.split(",") if v.strip()]
        else:
            import torch

            ids = [str(i) for i in range(torch.cuda.device_count())]
        if len(ids) < nprocs:
            raise RuntimeError(f"{nprocs} processes need {nprocs} GPUs; {len(ids)} visible")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[:nprocs])
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
        env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    return env


def run_logged(cmd: list[str], env: dict[str, str], log_path: Path, timeout: float, settle: float = 60.0) -> int | str:
    """Run ``cmd`` in its own session with stdout and stderr in ``log_path``; its exit code, or ``"timeout after
    T s"`` when the limit killed it. Every process of the session (torchrun and the ranks it started) is gone when
    this returns, so the next run does not meet the GPU memory of the last one."""
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                             env={**os.environ, **env})
        try:
            rc: int | str = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = f"timeout after {timeout} s"
    wait_group_gone(p.pid, settle)
    return rc


def live_members(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that have not exited (zombies, which hold no GPU memory, left out)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def wait_group_gone(pgid: int, limit: float) -> bool:
    """Kill what is left of process group ``pgid`` (ranks a failed torchrun left behind) and wait up to ``limit``
    seconds until none of its processes is alive; whether none is."""
    deadline = time.monotonic() + limit
    while pids := live_members(pgid):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def rank_tail(lines: list[str], n: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``n`` lines the ranks wrote, before torchrun's own failure report (its traceback and summary)."""
    cut = next((i for i in range(len(lines) - 1, -1, -1)
                if "elastic" in lines[i] and "failed (exitcode" in lines[i]), len(lines))
    return lines[:cut][-n:]


def outcome(rc: int | str, perf: Path, skip: int, lines: list[str], max_step: int | None = None) -> dict:
    """A run's figures from its ``perf.jsonl`` (:func:`read_perf`), or ``error`` + ``log_tail``. ``rc``: the exit
    code, or a string for a run ended by the limit, whose intervals logged before it still count (with a ``note``
    saying so)."""
    failed = rc if isinstance(rc, str) else f"exit {rc}"
    if rc != 0 and not isinstance(rc, str) or not perf.exists():
        return {"error": failed if rc != 0 else "no perf.jsonl", "log_tail": rank_tail(lines)}
    logged = sum(1 for line in perf.read_text().splitlines() if line.strip())
    if rc != 0 and logged <= skip:
        return {"error": f"{failed} after {logged} logged interval(s), all warm-up", "log_tail": rank_tail(lines)}
    try:
        figures = read_perf(perf, skip, max_step)
    except (RuntimeError, ValueError, KeyError) as e:
        why = f"unreadable perf.jsonl: {e}"
        return {"error": f"{failed} ({why})" if rc != 0 else why, "log_tail": rank_tail(lines)}
    figures.pop("last_logged_step")
    if rc != 0:
        figures.update(note=f"{rc}: the figures are the intervals logged before the limit", log_tail=rank_tail(lines))
    return figures


# --------------------------------------------------------------------------------------------------
# recipes in this process


def set_override(recipe, item: str) -> None:
    """``a.b.c=value`` on a Fiddle config tree (value parsed as a Python literal, else kept as a string)."""
    import ast

    key, value = item.split("=", 1)
    try:
        value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        value = {"true": True, "false": False, "null": None}.get(value.lower(), value)
    *path, last = key.split(".")
    node = recipe
    for part in path:
        node = getattr(node, part)
    setattr(node, last, value)


def load_recipe(factory: str, overrides: Sequence[str] = ()):
    """The registered factory's recipe (a Fiddle config of ``nemo_vfm.train.train``, as ``launchers/train.py``
    builds it) with simple ``key=value`` overrides."""
    import catalogue
    from nemo_run.config import get_type_namespace

    from nemo_vfm.train import train
    from nemo_vfm_recipes.launch import register_recipes

    register_recipes()
    recipe = catalogue._get((get_type_namespace(train), factory))()
    for item in overrides:
        set_override(recipe, item)
    return recipe


# --------------------------------------------------------------------------------------------------
# results


def git_commit(short: bool = True) -> str:
    """The checkout's commit, or ``"unknown"`` (a copied tree without git history)."""
    cmd = ["git", "rev-parse", *(["--short"] if short else []), "HEAD"]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment(device, commit: str | None = None) -> dict:
    """What every result records: device name, torch version, date, commit (``commit`` or the checkout's) and
    the command. ``device``: a ``torch.device`` or ``"cuda"`` / ``"cpu"``."""
    import torch

    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
            "commit": commit or git_commit(), "command": " ".join(sys.argv)}


def write_json(path: str | Path, env: dict, results: list[dict] | dict) -> None:
    """``{**env, "results": results}`` to ``path`` (written after every case, so that a crash keeps what ran)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({**env, "results": results}, indent=1, default=str))


def pyplot():
    """``matplotlib.pyplot`` on the file backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save and close ``fig`` (its folder made); the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
