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


def test_accumulated_micro_batches_log_sample_and_record_once_per_step(tmp_path, monkeypatch):
    """``accumulate_grad_batches=2``: the step log, ``metrics.jsonl`` and the previews act at optimizer steps only
    (before, each fired again on the next step's first micro-batch, and at step 0), a logged step counts the
    samples of both of its micro-batches and logs the mean of their losses (not Lightning's loss / 2), and the two
    micro-batches of a step draw different noise."""
    import json

    from nemo_vfm.lightning import module, throughput

    messages = []
    monkeypatch.setattr(throughput, "rank_zero_info", messages.append)

    draws = []
    real = module.step_generator
    monkeypatch.setattr(module, "step_generator",
                        lambda seed, step, rank, device, micro_batch=0: draws.append((step, micro_batch)) or
                        real(seed, step, rank, device, micro_batch))
    losses, log_step = [], module.DiffusionModule.log_micro_batch
    monkeypatch.setattr(module.DiffusionModule, "log_micro_batch", lambda self, loss, *a: losses.append(loss.item()) or
                        log_step(self, loss, *a))

    from nemo_vfm.data.synthetic import ShapesDataModule
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.models.dit.flavors import dit_config
    from nemo_vfm.train import ExperimentConfig, train

    train(model=dit_config("tiny", in_channels=12, context_dim=16, patch_size=(1, 2, 2)),
          data=ShapesDataModule(num_clips=32, num_frames=2, height=16, width=16, batch_size=4,
                                tokenizer_kwargs={"spatial_compression": 2}, text_encoder_kwargs={"dim": 16}),
          trainer=TrainerConfig(max_steps=4, precision="32-true", accelerator="cpu", devices=1, accumulate_grad_batches=2,
                                log_every_n_steps=2),
          log=ExperimentConfig(name="run", root=str(tmp_path)),
          sampling=SamplingConfig(every_n_steps=2, num_steps=2, num_samples=1))
    run = tmp_path / "run"
    perf = [json.loads(line) for line in (run / "perf.jsonl").read_text().splitlines()]
    assert [(r["step"], r["steps"]) for r in perf] == [(2, 2), (4, 2)]
    assert draws == [(step, micro) for step in range(4) for micro in (0, 1)]
    assert perf[0]["samples_per_s"] * perf[0]["step_time_s"] * 2 == pytest.approx(2 * 2 * 4)  # 2 steps x 2 x 4
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    means = [(a + b) / 2 for a, b in zip(losses[::2], losses[1::2])]  # a step's loss: the mean of its micro-batches'
    assert [r["loss"] for r in rows if "loss" in r] == pytest.approx(means, rel=1e-5)
    assert sorted(p.name for p in (run / "samples").glob("*.gif")) == ["step=00000002.gif", "step=00000004.gif"]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step=00000004.ckpt"]  # final, at optimizer step 4
    logged = [float(m.split(" loss ")[1].split()[0]) for m in messages if m.startswith("step 2/4 loss")]
    assert logged == [pytest.approx(next(r["loss"] for r in rows if r["step"] == 2), abs=1e-4)]


def test_step_generator_keeps_its_draws_for_single_batches_and_separates_micro_batches():
    import torch

    from nemo_vfm.lightning.module import step_generator

    def draw(micro):
        return torch.randn(4, generator=step_generator(1234, 7, 0, "cpu", micro))

    g = torch.Generator().manual_seed((1234 * 1_000_003 + 7) * 65_537)  # the seed before micro-batches had one
    assert torch.equal(draw(0), torch.randn(4, generator=g)) and not torch.equal(draw(0), draw(1))
