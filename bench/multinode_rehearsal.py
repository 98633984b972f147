"""A multi-node rehearsal on one host: ``launchers/slurm/train.sbatch`` runs as Slurm would run it on ``--nodes``
nodes (``srun`` and ``scontrol`` are stand-ins that start one copy of the command per "node", each seeing its own
GPUs), so the script's environment handling, the per-node ``torchrun --nnodes N`` launches and their c10d
rendezvous are the real ones. The run saves a checkpoint at its last step; a second run then resumes it on a
different layout (``--resume-nprocs`` processes, one node, ``torchrun --standalone``) and trains as many steps more.

    # 2 "nodes" x 2 GPUs, then resume on 2 GPUs
    python bench/multinode_rehearsal.py --nodes 2 --per-node 2 --resume-nprocs 2 --factory pretrain_xl \\
        --steps 20 --out bench/results/multinode_rehearsal_2x2.json
    # CPU (gloo), what tests/bench runs
    python bench/multinode_rehearsal.py --device cpu --nodes 2 --per-node 1 --resume-nprocs 1 --factory quickstart \\
        --steps 4 --set model.num_layers=2 --set model.hidden_size=64 --out /tmp/r.json

What is checked and written (JSON: device, date, commit, commands, figures): every rank joined one world of
``nodes x per_node`` processes; the first run reached its last step and wrote the checkpoint (its size and save
time from the "checkpoint saved" log line); the resumed run loaded it (load time from the "checkpoint loaded" line
that ``VFMParallelStrategy``'s loader prints; Lightning's own strategies, e.g. the CPU quickstart's, print none),
continued at the next step and finished; step times from both runs' ``perf.jsonl``. Any failure is recorded with
the tail of the log and the script exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.harness import NO_MULTICAST, ROOT, bookkeeping, environment, read_perf, write_json  # noqa: E402

# srun stand-in: `srun [options] cmd...` runs cmd once per node (--nodes=N, default 1) with SLURM_NODEID and, on
# CUDA, that node's slice of the host's GPUs; it waits for all and exits with the first failure.
SRUN = r"""#!/bin/bash
nodes=1; chdir=""
while [[ $# -gt 0 && "$1" == -* ]]; do
  case "$1" in
    --nodes=*) nodes="${1#--nodes=}" ;;
    --chdir=*) chdir="${1#--chdir=}" ;;
    -w|-N|-n) shift ;;
  esac
  shift
done
if [[ "$1" == hostname ]]; then echo 127.0.0.1; exit 0; fi  # one host: the head node's address is loopback
[[ -n "$chdir" ]] && cd "$chdir"
pids=()
for ((i = 0; i < nodes; i++)); do
  gpus=""
  if [[ "$REHEARSAL_DEVICE" == cuda ]]; then
    gpus=$(seq -s, $((i * REHEARSAL_PER_NODE)) $(((i + 1) * REHEARSAL_PER_NODE - 1)))
  fi
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_LOCALID=0 CUDA_VISIBLE_DEVICES=$gpus "$@" > "$REHEARSAL_LOGS/node$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || { [[ $rc == 0 ]] && rc=$?; }; done
exit $rc
"""
SCONTROL = """#!/bin/bash
# `scontrol show hostnames LIST` -> one name per node
for ((i = 0; i < ${SLURM_JOB_NUM_NODES:-1}; i++)); do echo "node$i"; done
"""
LOG_TAIL = 40


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stand_ins(folder: Path) -> Path:
    """A folder with the ``srun`` and ``scontrol`` stand-ins, to put first on PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def tail(path: Path, n: int = LOG_TAIL) -> list[str]:
    return path.read_text(errors="replace").splitlines()[-n:] if path.is_file() else []


def read_log_figures(text: str) -> dict:
    """World size, checkpoint save/load seconds and size, from a run's log text."""
    out: dict = {}
    members = re.findall(r"MEMBER: \d+/(\d+)", text)
    if members:
        out["world_size"] = int(members[0])
        out["ranks_joined"] = len(members)
    saved = re.findall(r"checkpoint saved: (\S+), ([\d.]+) GiB in ([\d.]+) s", text)
    if saved:
        out.update(checkpoint=saved[-1][0].rstrip(","), checkpoint_gib=float(saved[-1][1]), save_s=float(saved[-1][2]))
    resumed = re.findall(r"^resuming from (\S+)", text, flags=re.M)  # nemo_vfm.train: every run that resumes
    if resumed:
        out["resumed_from"] = Path(resumed[-1]).name
    loaded = re.findall(r"checkpoint loaded: (\S+) in ([\d.]+) s", text)  # VFMParallelStrategy's loader
    if loaded:
        out["load_s"] = float(loaded[-1][1])
    return out


def perf_figures(path: Path, after_step: int = 0) -> dict:
    """``read_perf``'s figures over the log rows after ``after_step`` (the first interval dropped as warm-up); none
    for a run that logged nothing."""
    try:
        figures = read_perf(path, skip=1, after_step=after_step)
    except (OSError, RuntimeError):
        return {}
    figures.pop("last_logged_step")
    return figures


def run_overrides(args, steps: int, root: Path) -> list[str]:
    """The case's overrides and the harness's bookkeeping, with a checkpoint at the first run's last step."""
    return [*args.overrides, *bookkeeping(args.factory, root, steps, args.every, args.device,
                                          checkpoint_every=args.steps)]


def run_multinode(args, work: Path, env: dict) -> dict:
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    shims = stand_ins(work / "bin")
    env = {**env, "PATH": f"{shims}:{env['PATH']}", "SLURM_JOB_NUM_NODES": str(args.nodes),
           "SLURM_JOB_NODELIST": f"node[0-{args.nodes - 1}]", "SLURM_JOB_ID": str(os.getpid()),
           "SLURM_SUBMIT_DIR": str(ROOT), "NPROC_PER_NODE": str(args.per_node), "RDZV_PORT": str(free_port()),
           "REPO": str(ROOT), "PYTHON": sys.executable, "REHEARSAL_DEVICE": args.device,
           "REHEARSAL_PER_NODE": str(args.per_node), "REHEARSAL_LOGS": str(logs)}
    cmd = ["bash", str(ROOT / "launchers" / "slurm" / "train.sbatch"), "--factory", args.factory,
           *run_overrides(args, args.steps, work), f"trainer.num_nodes={args.nodes}", f"trainer.devices={args.per_node}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
    text = "\n".join(p.read_text(errors="replace") for p in sorted(logs.glob("node*.log")))
    result = {"command": shlex.join(cmd).replace(str(work), "TMP").replace(str(ROOT) + "/", ""), "returncode": proc.returncode,
              "wall_s": round(time.perf_counter() - t0, 1), "sbatch_output": proc.stdout.strip().splitlines()[-3:],
              **read_log_figures(text)}
    result.update(perf_figures(work / args.factory / "perf.jsonl"))
    if proc.returncode or result.get("ranks_joined") != args.nodes * args.per_node or "checkpoint" not in result:
        result["error"] = "the multi-node run failed or did not save its checkpoint"
        result["log_tail"] = text.splitlines()[-LOG_TAIL:] + proc.stderr.splitlines()[-10:]
    return result


def run_resume(args, work: Path, env: dict) -> dict:
    log = work / "logs" / "resume.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(args.resume_nprocs), str(ROOT / "launchers" / "train.py"), "--factory", args.factory, "--yes",
           *run_overrides(args, 2 * args.steps, work)]
    if args.device == "cuda":
        env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(args.resume_nprocs))}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=args.timeout)
    text = log.read_text(errors="replace")
    metrics = work / args.factory / "metrics.jsonl"
    result = {"command": shlex.join(cmd).replace(str(work), "TMP").replace(str(ROOT) + "/", ""), "returncode": proc.returncode,
              "wall_s": round(time.perf_counter() - t0, 1), **read_log_figures(text)}
    # metrics.jsonl holds both runs' rows: the resumed run's first row follows the first run's last step
    steps = [json.loads(line).get("step") for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    result["last_step"] = max((s for s in steps if s is not None), default=None)
    result["continued_at"] = next((s for s in steps if s is not None and s > args.steps), None)
    result.update(perf_figures(work / args.factory / "perf.jsonl", after_step=args.steps))
    ok = (proc.returncode == 0 and result.get("resumed_from") and result["continued_at"] == args.steps + 1
          and result["last_step"] == 2 * args.steps)
    if not ok:
        result["error"] = "the resumed run failed, did not load the checkpoint or did not continue at the next step"
        result["log_tail"] = text.splitlines()[-LOG_TAIL:]
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--factory", required=True)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--per-node", type=int, default=2, help="processes (GPUs) per node")
    p.add_argument("--resume-nprocs", type=int, default=2, help="processes of the resumed run (one node)")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="an override for both runs")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--steps", type=int, default=20, help="steps of the first run (the resumed run trains as many)")
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--keep", help="keep the run folder and logs here (default: a temporary folder)")
    p.add_argument("--commit")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="vfm-rehearsal-"))
    env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    first = run_multinode(args, work, env)
    second = run_resume(args, work, env) if "error" not in first else {"error": "not run: the first run failed"}
    out = {**environment(args.device, args.commit), "command": shlex.join(["python", *sys.argv]),
           "factory": args.factory, "nodes": args.nodes, "per_node": args.per_node,
           "resume_nprocs": args.resume_nprocs, "steps": args.steps, "multinode": first, "resume": second}
    write_json(args.out, {k: v for k, v in out.items() if k not in ("multinode", "resume")},
               {"multinode": first, "resume": second})
    for name, r in (("multi-node", first), ("resume", second)):
        figures = {k: r[k] for k in ("world_size", "step_s", "checkpoint_gib", "save_s", "load_s", "continued_at",
                                     "wall_s") if k in r}
        print(f"{name}: {'FAILED ' + r['error'] if 'error' in r else 'ok'} {figures}")
        for line in r.get("log_tail", [])[-15:]:
            print("   ", line)
    print(f"wrote {args.out}")
    return 1 if "error" in first or "error" in second else 0


if __name__ == "__main__":
    sys.exit(main())
