"""``bench/four_gpu_rows.sh``: each group runs its rows through ``bench/scaling.py`` (or the equivalence check) with
NVLink multicast off, one JSON per row in the output folder; an unknown group is refused. The interpreters are
stubbed: the rows themselves need a 4-GPU host."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GROUPS = {"equivalence": 1, "xl": 2, "7b": 2, "74k": 2, "stdit": 2, "wan480": 1, "wan720": 1}


def _run(group: str, tmp_path: Path):
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    for name in ("python3", "torchrun"):  # record the command line and the multicast variables
        (stub / name).write_text(f'#!/bin/sh\necho "{name} $NCCL_NVLS_ENABLE$TORCH_SYMM_MEM_DISABLE_MULTICAST '
                                 f'$* OUT=$OUT" >> {log}\n')
        (stub / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "bench/four_gpu_rows.sh", group, str(tmp_path / "out"), "abc1234"], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    return proc, (log.read_text().splitlines() if log.exists() else [])


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_each_group_runs_its_rows_into_the_output_folder(group, tmp_path):
    proc, calls = _run(group, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(calls) == GROUPS[group] and all(c.split()[1] == "01" for c in calls)  # multicast off
    if group == "equivalence":
        assert "bench/parallel_equivalence.py" in calls[0] and f"OUT={tmp_path / 'out'}" in calls[0]
        return
    outs = [c.split("--out ")[1].split()[0] for c in calls]
    assert all(c.split()[2] == "bench/scaling.py" and "--commit abc1234" in c for c in calls)
    assert len(set(outs)) == len(outs) and all(o.startswith(str(tmp_path / "out")) and o.endswith("_4xh200_abc1234.json")
                                               for o in outs)


def test_an_unknown_group_is_refused(tmp_path):
    proc, calls = _run("nope", tmp_path)
    assert proc.returncode == 2 and "unknown group nope" in proc.stderr and calls == []
