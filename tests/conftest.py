"""Suite-wide hygiene: a test that trains in this process under ``VFMParallelStrategy`` (one process, gloo) leaves
the default process group up; tear it down so the next test starts without one."""

import pytest


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def lock_holder():
    """``hold(run_folder)``: another process that takes the run folder's lock and keeps it (killed at teardown, or
    earlier with ``.kill()``); returns its ``Popen`` once it holds the lock."""
    import subprocess
    import sys
    import textwrap

    procs = []

    def hold(exp):
        p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import time
            from nemo_vfm.io.run_lock import acquire_run
            acquire_run({str(exp)!r})
            print("locked", flush=True)
            time.sleep(60)""")], stdout=subprocess.PIPE, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "locked"
        return p

    yield hold
    for p in procs:
        p.kill()
        p.wait()
