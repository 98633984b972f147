import gc
from types import SimpleNamespace

import pytest

from nemo_vfm.lightning.callbacks import ScheduledGC
from nemo_vfm.train import TrainerConfig


@pytest.fixture
def collections(monkeypatch):
    calls = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: calls.append(generation) or 0)
    yield calls
    gc.enable()


def _run(cb, steps, fail_at=None):
    trainer = SimpleNamespace(global_step=0)
    cb.on_train_start(trainer, None)
    for step in range(1, steps + 1):
        assert not gc.isenabled(), "automatic collection runs during training"
        trainer.global_step = step
        if step == fail_at:
            cb.on_exception(trainer, None, RuntimeError("boom"))
            return
        cb.on_train_batch_end(trainer, None, None, None, step - 1)
    cb.on_train_end(trainer, None)


def test_scheduled_gc_collects_at_fixed_steps(collections):
    gc.enable()
    _run(ScheduledGC(every_n_steps=2), steps=21)
    # a full collection at the start, the young generations at steps 2, 4, ..., 18, all of them at step 20
    assert collections == [2] + [1] * 9 + [2]
    assert gc.isenabled()


def test_scheduled_gc_restores_collection_on_exception(collections):
    gc.enable()
    _run(ScheduledGC(every_n_steps=100), steps=5, fail_at=2)
    assert gc.isenabled()


def test_scheduled_gc_leaves_collection_off_when_it_was_off(collections):
    gc.disable()
    _run(ScheduledGC(every_n_steps=2), steps=2)
    assert not gc.isenabled()


def test_gc_every_n_steps_is_validated():
    with pytest.raises(ValueError, match="gc_every_n_steps"):
        TrainerConfig(gc_every_n_steps=0)
    assert TrainerConfig(gc_every_n_steps=None).gc_every_n_steps is None
