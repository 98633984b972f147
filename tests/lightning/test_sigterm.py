"""Rank 0's SIGTERM stops every rank at the same step, shared over the host (``nemo_vfm.lightning.sigterm``)."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
from gloo_launcher import run_distributed  # noqa: E402


def test_lightning_still_has_the_per_step_device_broadcast():
    """When Lightning drops or renames it (upstream fix of its issue #21487), revisit nemo_vfm/lightning/sigterm.py."""
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    assert hasattr(_TrainingEpochLoop, "_broadcast_sigterm_tensor")


def _steps_until_stop(rank, world, sigterm_at):
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from nemo_vfm.lightning.sigterm import install_host_sigterm_check

    loop = _TrainingEpochLoop.__new__(_TrainingEpochLoop)
    trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=loop), received_sigterm=False)
    assert install_host_sigterm_check(trainer)
    for step in range(10):
        trainer.received_sigterm = rank == 0 and step >= sigterm_at  # only rank 0 is signalled
        try:
            loop._broadcast_sigterm_tensor()
        except SIGTERMException:
            return step
    return None


@pytest.mark.parametrize("sigterm_at", [3, 99])
def test_every_rank_stops_at_the_step_rank_0_was_signalled(sigterm_at):
    expected = sigterm_at if sigterm_at < 10 else None
    assert run_distributed(_steps_until_stop, 2, sigterm_at) == [expected, expected]
