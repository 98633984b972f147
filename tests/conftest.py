"""Suite-wide hygiene: a test that trains in this process under ``VFMParallelStrategy`` (one process, gloo) leaves
the default process group up and its rendezvous variables (``MASTER_PORT``...) in the environment; tear down the
one and restore the others so the next test, and the subprocesses it starts, begin without them. The ``timing`` marker (tests that
measure wall-clock throughput run alone, see the Makefile). Shared fixtures: steps of a recipe on the CPU, a run-folder lock holder, and a tiny
random Wan folder (diffusers layout) that Wan recipes start from as from the published one."""

import sys
from pathlib import Path

import pytest

# bench/ (the benchmarks and the parallel-equivalence harness the layout tests share) is a package at the repository
# root, not installed with nemo_vfm: make `import bench` work from any folder, after the installed packages
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.append(ROOT)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "timing: asserts on wall-clock throughput; `make test` runs these after the parallel workers, "
        "with no other test beside them")


# what an in-process training (Lightning's launcher) writes into os.environ for its process group
_RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")


@pytest.fixture(autouse=True)
def _no_leftover_process_group():
    import os

    before = {k: os.environ.get(k) for k in _RENDEZVOUS_ENV}
    yield
    # a later subprocess must not inherit a port this test's training picked (another xdist worker may hold it by
    # then: EADDRINUSE)
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def cpu_steps():
    """``run(recipe, root, steps=2, name=None) -> summary``: ``steps`` training steps of a recipe in this process on
    the CPU (fp32, one device, no FSDP: one process shards nothing), a checkpoint at the last one, no progress bar or
    TensorBoard, the run under ``root/runs``; checks that it reached ``steps``."""
    import fiddle as fdl

    def run(recipe, root, steps: int = 2, name: str | None = None) -> dict:
        recipe.trainer.strategy.fsdp = False
        t = recipe.trainer
        t.accelerator, t.devices, t.max_steps, t.checkpoint_every_n_steps = "cpu", 1, steps, steps
        t.enable_progress_bar, t.precision = False, "32-true"
        recipe.log.root, recipe.log.tensorboard = str(Path(root) / "runs"), False
        if name is not None:
            recipe.log.name = name
        out = fdl.build(recipe)()
        assert out["step"] == steps
        return out

    return run


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


@pytest.fixture(scope="module")
def wan_folder(tmp_path_factory):
    pytest.importorskip("diffusers")
    from nemo_vfm.models.wan import convert
    from nemo_vfm.models.wan.model import WanConfig

    cfg = WanConfig(num_layers=2, hidden_size=32, num_heads=2, ffn_size=64, in_channels=4, out_channels=4,
                    context_dim=16, freq_dim=32, text_len=8)
    out = tmp_path_factory.mktemp("wan")
    convert.save_weights(cfg.build().state_dict(), out, cfg, layout="diffusers")
    return out
