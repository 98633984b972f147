"""A single-node Slurm cluster on this machine (Debian's slurm-wlm + munge), for trying the Slurm paths.

    sudo python launchers/slurm/local_cluster.py start     # installs the packages if missing, starts daemons
    sinfo; sbatch launchers/slurm/train.sbatch ...
    sudo python launchers/slurm/local_cluster.py stop      # stops the daemons it started (by PID)

Needs root (it writes /etc/slurm/slurm.conf and runs munged as the munge user). The tests use the same
:func:`start` / :func:`stop`. The node gets every CPU of this machine and one default partition ``debug``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

STATE = Path("/run/nemo_vfm_local_slurm.json")
PARTITION = "debug"
PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]


def slurm_conf(hostname: str, cpus: int, memory_mb: int) -> str:
    """The slurm.conf of a one-node cluster whose controller and node are ``hostname`` on 127.0.0.1."""
    return "\n".join([
        "ClusterName=local",
        f"SlurmctldHost={hostname}(127.0.0.1)",
        "AuthType=auth/munge",
        "SlurmUser=root",
        "StateSaveLocation=/var/spool/slurmctld",
        "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "ReturnToService=2",
        "MpiDefault=none",
        f"NodeName={hostname} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def install() -> None:
    """``apt-get install`` the Slurm and munge packages when ``slurmctld`` is missing."""
    if shutil.which("slurmctld") and shutil.which("slurmd") and shutil.which("sbatch") and shutil.which("munged"):
        return
    if not shutil.which("apt-get"):
        raise RuntimeError("slurmctld is not installed and apt-get is not available; install Debian's "
                           f"{' '.join(PACKAGES)} by hand")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def _munge_key() -> None:
    key = Path("/etc/munge/munge.key")
    if not key.exists() or key.stat().st_size == 0:
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_bytes(os.urandom(1024))
    shutil.chown(key, "munge", "munge")
    key.chmod(0o400)
    for d in ("/run/munge", "/var/lib/munge", "/var/log/munge"):
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")


def _pid_of(pidfile: Path, timeout: float = 10.0) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pidfile.exists() and pidfile.read_text().strip():
            return int(pidfile.read_text().strip())
        time.sleep(0.1)
    raise RuntimeError(f"{pidfile} did not appear")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def running() -> dict | None:
    """The PIDs of a cluster started by :func:`start` that still runs, else None."""
    if not STATE.exists():
        return None
    pids = json.loads(STATE.read_text())
    return pids if all(_alive(p) for p in pids.values()) else None


def start(cpus: int | None = None, timeout: float = 60.0) -> dict:
    """Install (if needed) and start munged, slurmctld and slurmd; wait until the node is idle.

    Returns ``{"munged": pid, "slurmctld": pid, "slurmd": pid}``. Idempotent: a cluster already started
    by this module is reused.
    """
    if os.geteuid() != 0:
        raise PermissionError("starting a local Slurm cluster needs root (it writes /etc/slurm and runs munged)")
    pids = running()
    if pids:
        return pids
    stop()  # a half-dead earlier cluster
    install()
    host = socket.gethostname()
    cpus = cpus or os.cpu_count() or 1
    memory_mb = max(1024, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 // 2)
    for d in ("/var/spool/slurmctld", "/var/spool/slurmd", "/var/log/slurm", "/etc/slurm"):
        Path(d).mkdir(parents=True, exist_ok=True)
    Path("/etc/slurm/slurm.conf").write_text(slurm_conf(host, cpus, memory_mb))
    _munge_key()
    munge_pidfile = Path("/run/munge/munged.pid")
    munge_pidfile.unlink(missing_ok=True)
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged", "--force"], check=True)
    pids = {"munged": _pid_of(munge_pidfile)}
    log = open("/var/log/slurm/daemons.out", "ab")
    for name in ("slurmctld", "slurmd"):
        # -c: start clean (no jobs recovered from an earlier, possibly killed, cluster)
        proc = subprocess.Popen([name, "-D", "-c"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        pids[name] = proc.pid
        if name == "slurmctld":
            time.sleep(1.0)
    STATE.write_text(json.dumps(pids))
    deadline = time.time() + timeout
    state = ""
    while time.time() < deadline:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True)
        state = r.stdout.strip()
        if r.returncode == 0 and state in ("idle", "mixed", "allocated"):
            return pids
        if not all(_alive(p) for p in pids.values()):
            break
        time.sleep(0.5)
    tail = Path("/var/log/slurm/daemons.out").read_text(errors="replace")[-2000:]
    stop()
    raise RuntimeError(f"the local Slurm node did not become idle (state {state!r}); daemon log:\n{tail}")


def stop() -> None:
    """Stop the daemons started by :func:`start`, by PID (slurmd, slurmctld, then munged)."""
    if not STATE.exists():
        return
    pids = json.loads(STATE.read_text())
    if all(_alive(p) for p in pids.values()):  # cancel what still runs, so no job outlives the daemons
        subprocess.run(["scancel", "--full", "--partition", PARTITION], capture_output=True, timeout=30)
        for _ in range(100):
            r = subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=30)
            if r.returncode != 0 or not r.stdout.strip():
                break
            time.sleep(0.2)
        for _ in range(50):  # the job steps' processes on this node, by PID, until none is left
            r = subprocess.run(["scontrol", "listpids"], capture_output=True, text=True, timeout=30)
            step_pids = [int(line.split()[0]) for line in r.stdout.splitlines()[1:] if line.split()[:1] != ["-1"]
                         and line.split()[0].isdigit()]
            if r.returncode != 0 or not step_pids:
                break
            for pid in step_pids:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
    for name in ("slurmd", "slurmctld", "munged"):
        pid = pids.get(name)
        if pid and _alive(pid):
            os.kill(pid, 15)
            for _ in range(50):
                if not _alive(pid):
                    break
                try:  # reap our own children
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, 9)
    STATE.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["start"]:
        print(json.dumps(start()))
        return 0
    if argv[:1] == ["stop"]:
        stop()
        return 0
    print("usage: python launchers/slurm/local_cluster.py start|stop", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
