"""What a user reads when a run through the CLI (``launchers/train.py``, ``vfm train``: ``recipes/cli.py``'s
``run_cli``) stops: a designed stop or configuration error is one line, ``error: <the project's sentence>``, and a
non-zero exit, in one process and under torchrun; anything else keeps its traceback."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fiddle as fdl
import pytest

from nemo_vfm.errors import VFMError, user_message
from nemo_vfm.lightning.nonfinite import NonFiniteError

ROOT = Path(__file__).resolve().parents[2]
# lr 1e30 without clipping: the loss is finite at step 1 and NaN/Inf at step 2
DIVERGE = ["--factory", "quickstart", "--yes", "optim.lr=1e30", "optim.warmup_steps=0", "trainer.gradient_clip_val=null",
           "trainer.max_steps=4", "data.num_clips=8", "data.batch_size=4", "trainer.enable_progress_bar=false",
           "sampling.enabled=false"]
STOP = "training stopped: the loss or the gradients became NaN/Inf at step 2"


def _env() -> dict:
    # not the rendezvous of this test process (in-process trainings of earlier tests leave MASTER_PORT set)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    return {**env, "OMP_NUM_THREADS": "1"}


def _run(cmd: list[str], timeout: int = 300) -> tuple[int, str, str]:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
    return r.returncode, r.stdout, r.stderr


def _grab(fn) -> BaseException:
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the test inspects it)
        return e
    raise AssertionError("no exception")


def test_user_message_tells_designed_errors_from_surprises():
    assert issubclass(NonFiniteError, VFMError) and issubclass(NonFiniteError, RuntimeError)
    assert user_message(NonFiniteError("training stopped: x")) == "training stopped: x"
    from nemo_vfm.models.wan.model import WanConfig

    # a config check (a ValueError raised by our statement), also through Fiddle's build (which wraps it)
    for build in (lambda: WanConfig(attention="bogus"), lambda: fdl.build(fdl.Config(WanConfig, attention="bogus"))):
        assert user_message(_grab(build)) == "WanConfig.attention must be one of ('dense', 'sta', 'vsa'), got 'bogus'"
    # a ValueError from a builtin that our code called, and other types, are surprises
    from nemo_vfm.models.common import flops

    assert user_message(_grab(lambda: flops.linear(int("x"), 1, 1))) is None
    assert user_message(_grab(lambda: 1 / 0)) is None
    assert user_message(RuntimeError("boom")) is None


def test_a_nonfinite_stop_reads_as_one_line_and_exits_nonzero(tmp_path):
    rc, out, err = _run([sys.executable, str(ROOT / "launchers" / "train.py"), *DIVERGE, f"log.root={tmp_path}"])
    assert rc == 1, (out + err)[-3000:]
    assert sum(line.startswith(f"error: {STOP}") for line in err.splitlines()) == 1, err[-3000:]
    assert "Unexpected error" not in out + err and "Traceback" not in err


def test_an_unexpected_exception_keeps_its_traceback(tmp_path):
    """A target that divides by zero keeps its traceback; a config check in the library is one line."""
    script = tmp_path / "cli.py"
    script.write_text(textwrap.dedent("""
        import sys
        import nemo_run as run
        from nemo_vfm_recipes.cli import run_cli

        def target(kind: str = "bug"):
            if kind == "bug":
                return 1 / 0
            from nemo_vfm.models.wan.model import WanConfig
            WanConfig(attention="bogus")

        @run.cli.factory(target=target)
        def case() -> run.Partial:
            return run.Partial(target)

        sys.exit(run_cli(target, sys.argv[1:], "cli.py"))
    """))
    rc, out, err = _run([sys.executable, str(script), "--factory", "case", "--yes", "kind=bug"])
    assert rc == 1 and "Traceback (most recent call last)" in err, err[-3000:]
    assert err.strip().endswith("ZeroDivisionError: division by zero") and "Unexpected error" not in out + err
    rc, out, err = _run([sys.executable, str(script), "--factory", "case", "--yes", "kind=config"])
    assert rc == 1 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == "error: WanConfig.attention must be one of ('dense', 'sta', 'vsa'), got 'bogus'"


@pytest.mark.slow
def test_a_nonfinite_stop_under_torchrun_is_one_line_per_rank(tmp_path):
    rc, out, err = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         str(ROOT / "launchers" / "train.py"), *DIVERGE, f"log.root={tmp_path}"])
    assert rc != 0, (out + err)[-3000:]
    lines = (out + err).splitlines()
    for rank in (0, 1):
        assert sum(line.startswith(f"error: [rank {rank}] {STOP}") for line in lines) == 1, (out + err)[-3000:]
    assert "Unexpected error" not in out + err
    assert "NonFiniteError" not in out + err  # no traceback of the stop on any rank
