"""Pipeline parallelism through ``train()`` / ``trainer.fit`` with ``VFMParallelStrategy``: a tiny DiT (and
MovieGen) trained for 3 steps under PP2 (1F1B, interleaved, GPipe, full activation checkpointing) and
PP2 x TP2/CP2/DP2/FSDP2 matches the run without pipeline parallelism (per-step losses, final weights and EMA
weights from the checkpoints), resumes from its sharded checkpoint with the uninterrupted run's losses, and
bad layouts fail before the model exists.

AdamW runs with a large ``eps`` so that updates are linear in the gradients: Adam's normalisation would
amplify float round-off in near-zero gradients (as the SGD of ``bench/equivalence.py`` avoids),
and it would hide gradient-scale mistakes.
"""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
from gloo_launcher import run_distributed  # noqa: E402

from nemo_vfm.io.safe_load import safe_load  # noqa: E402
from nemo_vfm.lightning.callbacks import read_metrics  # noqa: E402
from nemo_vfm.lightning.strategy import VFMParallelStrategy  # noqa: E402
from nemo_vfm.parallel.checkpoint import consolidated_state_dict  # noqa: E402

STEPS = 3
FP32 = dict(param_dtype=None)


def _config(family: str, num_layers: int = 4):
    if family == "stdit":
        from nemo_vfm.models.stdit.model import STDiTConfig

        return STDiTConfig(num_layers=num_layers, hidden_size=32, num_heads=4, in_channels=4, context_dim=16,
                           patch_size=(1, 2, 2))
    if family == "moviegen":
        from nemo_vfm.models.moviegen.model import MovieGenConfig

        return MovieGenConfig(num_layers=num_layers, hidden_size=32, num_heads=4, num_kv_heads=2, in_channels=4,
                              context_dim=16, patch_size=(1, 2, 2), max_grid=(4, 4, 4))
    from nemo_vfm.models.dit.model import DiTConfig

    return DiTConfig(num_layers=num_layers, hidden_size=32, num_heads=4, in_channels=4, context_dim=16,
                     adaln_lora_rank=4)


def _train(rank, world, root, strategy_kw, *, family="dit", objective="edm", steps=STEPS, batch_size=2):
    """``train()`` on this process (``strategy_kw=None``: no strategy); rank 0 returns the per-step losses and
    learning rates (``{"loss": [...], "lr": [...]}``)."""
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.diffusion.flow_matching import FlowMatching
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16, context_length=3,
                                batch_size=batch_size, num_samples=16)
    strategy = VFMParallelStrategy(**strategy_kw) if strategy_kw is not None else "auto"
    trainer = TrainerConfig(max_steps=steps, devices=world, accelerator="cpu", precision="32-true", strategy=strategy,
                            log_every_n_steps=1, checkpoint_every_n_steps=2, enable_progress_bar=False)
    train(model=_config(family), data=data, trainer=trainer, objective=EDM() if objective == "edm" else FlowMatching(),
          optim=OptimConfig(lr=0.5, eps=10.0, warmup_steps=2), log=ExperimentConfig(name="run", root=root,
                                                                                     tensorboard=False),
          ema_decay=0.9, seed=7)
    if rank != 0:
        return None
    rows = read_metrics(Path(root) / "run" / "metrics.jsonl")
    return {"loss": [r["loss"] for r in rows], "lr": [r["lr"] for r in rows]}


def _runs(rank, world, root, runs: dict):
    """Several trainings on the same processes (one spawn); rank 0 returns their losses by name."""
    out = {name: _train(rank, world, f"{root}/{name}", kw, **extra) for name, (kw, extra) in runs.items()}
    return out if rank == 0 else None


def _weights(root, name, step=STEPS) -> dict:
    ckpt = Path(root) / name / "run" / "checkpoints" / f"step={step:08d}.ckpt"
    if ckpt.is_dir():  # a sharded (DCP) folder
        return consolidated_state_dict(ckpt, prefix="state_dict.")
    return safe_load(ckpt)["state_dict"]  # weights-only, our config classes allowed


def _assert_same_run(got, want, got_w, want_w, what):
    assert len(got["loss"]) == len(want["loss"]) == STEPS, (what, got)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), (what, got, want)
    assert got["lr"] == want["lr"] and got["lr"][0] < got["lr"][1], (what, got["lr"])  # warm-up as without PP
    assert set(got_w) == set(want_w), (what, set(got_w) ^ set(want_w))
    assert any(k.startswith("ema.") for k in got_w)
    err = {k: ((got_w[k] - v).abs().max() / v.abs().max().clamp_min(1e-12)).item() for k, v in want_w.items()}
    worst = max(err, key=err.get)
    # measured <= 8.4e-7; counting the duplicated embedders once per stage in the clipping norm gives 7.4e-6
    assert err[worst] < 3e-6, (what, worst, err[worst])


TWO = {
    "pp2_1f1b": (dict(pipeline_model_parallel_size=2, **FP32), {}),
    "pp2_interleaved": (dict(pipeline_model_parallel_size=2, pipeline_schedule="interleaved", microbatches=2, **FP32),
                        {}),
    "pp2_gpipe_flow": (dict(pipeline_model_parallel_size=2, pipeline_schedule="gpipe", **FP32),
                       dict(objective="flow")),
    "pp2_moviegen": (dict(pipeline_model_parallel_size=2, **FP32), dict(family="moviegen")),
    "pp2_full_ac": (dict(pipeline_model_parallel_size=2, activation_checkpointing="full", **FP32), {}),
    "dp2": (dict(fsdp=False, **FP32), {}),  # the reference of the data-parallel layouts below
}
SINGLE = {"edm": {}, "flow": dict(objective="flow"), "moviegen": dict(family="moviegen")}
REFERENCE = {"pp2_1f1b": "edm", "pp2_interleaved": "edm", "pp2_gpipe_flow": "flow", "pp2_moviegen": "moviegen",
             "pp2_full_ac": "edm"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pp")
    single = {name: _train(0, 1, str(root / name), None, **extra) for name, extra in SINGLE.items()}
    return root, single, run_distributed(_runs, 2, str(root), TWO)[0]


def test_pp2_schedules_and_families_train_like_one_process(runs):
    root, single, two = runs
    for name, ref in REFERENCE.items():
        _assert_same_run(two[name], single[ref], _weights(root, name), _weights(root, ref), name)


def test_a_pp_checkpoint_loads_for_generation(runs):
    from nemo_vfm.inference.checkpoint import load_checkpoint

    root, _, _ = runs
    loaded = load_checkpoint(root / "pp2_interleaved" / "run")  # the experiment folder: its newest checkpoint
    want = {k.removeprefix("ema."): v for k, v in _weights(root, "edm").items() if k.startswith("ema.")}
    got = loaded.net.state_dict()
    assert loaded.step == STEPS and set(got) == set(want)
    assert all(torch.allclose(got[k], v, rtol=1e-5, atol=1e-7) for k, v in want.items())


FOUR = {
    "pp2_tp2_sp": (dict(pipeline_model_parallel_size=2, tensor_model_parallel_size=2, sequence_parallel=True,
                        fsdp=False, **FP32), {}),
    "pp2_cp2": (dict(pipeline_model_parallel_size=2, context_parallel_size=2, fsdp=False, **FP32), {}),
    "pp2_dp2": (dict(pipeline_model_parallel_size=2, fsdp=False, **FP32), {}),
    "pp2_fsdp2": (dict(pipeline_model_parallel_size=2, fsdp=True, **FP32), {}),
}


@pytest.mark.slow
def test_pp2_with_tp_cp_dp_fsdp_trains_like_without_pipeline(runs):
    root, single, two = runs
    four = run_distributed(_runs, 4, str(root), FOUR)[0]
    for name in FOUR:  # TP/CP ranks share samples (one data stream, as one process); DP/FSDP: two streams
        ref = "dp2" if "dp2" in name or "fsdp2" in name else "edm"
        want = two[ref] if ref == "dp2" else single[ref]
        _assert_same_run(four[name], want, _weights(root, name), _weights(root, ref), name)


def _resume(rank, world, root):
    """Per schedule: 4 steps in one go, and 2 steps then a restart that resumes to 4 (rank 0: both losses)."""
    out = {}
    for schedule in ("1f1b", "interleaved"):
        kw = dict(pipeline_model_parallel_size=2, pipeline_schedule=schedule, microbatches=2, **FP32)
        whole = _train(rank, world, f"{root}/{schedule}_whole", kw, steps=4)
        _train(rank, world, f"{root}/{schedule}_cut", kw, steps=2)
        resumed = _train(rank, world, f"{root}/{schedule}_cut", kw, steps=4)
        out[schedule] = (whole, resumed)
    out["errors"] = [_resume_error(rank, world, f"{root}/1f1b_cut", dict(fsdp=False, **FP32)),  # PP run, no PP
                     _resume_error(rank, world, f"{root}/dp2", dict(fsdp=False, **FP32), first_steps=2,
                                   kw=dict(pipeline_model_parallel_size=2, **FP32))]  # run without PP, under PP
    return out if rank == 0 else None


def _resume_error(rank, world, root, first_kw, *, first_steps=0, kw=None) -> str:
    """Train ``first_steps`` with ``first_kw`` (0: the folder has a run), then resume with ``kw`` (default
    ``first_kw``) expecting a refusal; returns its message."""
    if first_steps:
        _train(rank, world, root, first_kw, steps=first_steps)
    try:
        _train(rank, world, root, kw or first_kw, steps=5)
    except ValueError as e:
        return str(e)
    return "resumed"


def test_pp2_resumes_from_its_checkpoint_with_the_uninterrupted_losses(tmp_path):
    results = run_distributed(_resume, 2, str(tmp_path))[0]
    pp_run_without_pp, run_under_pp = results.pop("errors")
    assert "saved with pipeline parallelism" in pp_run_without_pp, pp_run_without_pp
    assert "saved without pipeline parallelism" in run_under_pp, run_under_pp
    for schedule, (whole, resumed) in results.items():
        assert len(whole["loss"]) == len(resumed["loss"]) == 4
        assert resumed["loss"][2:] == pytest.approx(whole["loss"][2:], rel=1e-6, abs=1e-7), (schedule, resumed, whole)
        assert resumed["lr"] == whole["lr"], schedule
        a, b = _weights(tmp_path, f"{schedule}_whole", 4), _weights(tmp_path, f"{schedule}_cut", 4)
        assert set(a) == set(b), schedule
        bad = {k: (a[k] - b[k]).abs().max().item() for k in a if not torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-8)}
        assert not bad, (schedule, sorted(bad.items(), key=lambda kv: -kv[1])[:5])


# -- refused before the model is built ----------------------------------------------------------------
def _fit_single_launch(monkeypatch, devices, strategy, num_layers=4, family="dit", data_kw=None, data_attrs=None,
                       **trainer_kw):
    """``trainer.fit`` as if launched by torchrun (Lightning spawns nothing); returns the error and whether
    the network was built."""
    import lightning as L

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.lightning.module import DiffusionModule

    monkeypatch.setenv("LOCAL_RANK", "0")
    built = []
    base = type(_config(family))

    class Cfg(base):
        def build(self, device=None):
            built.append(1)
            return super().build(device)

    Cfg.__module__ = base.__module__  # the strategy looks up the family's plan by module

    fields = {k: getattr(_config(family, num_layers), k) for k in _config(family).__dataclass_fields__}
    module = DiffusionModule(Cfg(**fields), objective=EDM())
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16, context_length=3,
                                **(data_kw or {}))
    for k, v in (data_attrs or {}).items():
        setattr(data, k, v)
    trainer = L.Trainer(devices=devices, accelerator="cpu", strategy=strategy, max_steps=1, logger=False,
                        enable_checkpointing=False, **trainer_kw)
    with pytest.raises((ValueError, NotImplementedError)) as e:
        trainer.fit(module, datamodule=data)
    assert not built and not torch.distributed.is_initialized(), str(e.value)
    return str(e.value)


def test_layers_not_divisible_by_stages_fail_before_the_model_is_built(monkeypatch):
    msg = _fit_single_launch(monkeypatch, 2, VFMParallelStrategy(pipeline_model_parallel_size=2), num_layers=3)
    assert "num_layers=3" in msg and "2 pipeline stages" in msg, msg
    msg = _fit_single_launch(monkeypatch, 2, VFMParallelStrategy(pipeline_model_parallel_size=2,
                                                                 pipeline_schedule="interleaved"), num_layers=6)
    assert "num_layers=6" in msg and "4 pipeline stages" in msg, msg


def test_world_size_not_matching_the_pipeline_fails_before_the_model_is_built(monkeypatch):
    msg = _fit_single_launch(monkeypatch, 3, VFMParallelStrategy(pipeline_model_parallel_size=2))
    assert "world size 3" in msg and "pp" in msg and "2" in msg, msg
    msg = _fit_single_launch(monkeypatch, 2, VFMParallelStrategy(pipeline_model_parallel_size=2,
                                                                 tensor_model_parallel_size=2))
    assert "world size 2" in msg and "4" in msg, msg


def test_unsupported_pipeline_settings_fail_before_the_model_is_built(monkeypatch):
    pp2 = dict(pipeline_model_parallel_size=2)
    msg = _fit_single_launch(monkeypatch, 2, VFMParallelStrategy(**pp2), accumulate_grad_batches=2)
    assert "accumulate_grad_batches=2" in msg, msg
    msg = _fit_single_launch(monkeypatch, 2, VFMParallelStrategy(**pp2), data_kw=dict(batch_size=3))
    assert "batch_size=3" in msg and "2 pipeline micro-batches" in msg, msg
    msg = _fit_single_launch(monkeypatch, 2, VFMParallelStrategy(**pp2, microbatches=4), data_kw=dict(batch_size=2))
    assert "batch_size=2" in msg and "4 pipeline micro-batches" in msg, msg
    msg = _fit_single_launch(monkeypatch, 2, VFMParallelStrategy(**pp2), data_attrs=dict(max_seq_length=64))
    assert "packed" in msg and "max_seq_length" in msg, msg
    msg = _fit_single_launch(monkeypatch, 2, VFMParallelStrategy(**pp2), family="stdit")
    assert "ST-DiT" in msg, msg


def test_pipeline_knobs_checked_at_construction():
    with pytest.raises(ValueError, match="save_distributed_checkpoint"):
        VFMParallelStrategy(pipeline_model_parallel_size=2, save_distributed_checkpoint=False)
    with pytest.raises(ValueError, match="pp_schedule"):
        VFMParallelStrategy(pipeline_model_parallel_size=2, pipeline_schedule="zero_bubble")
    assert VFMParallelStrategy(pipeline_model_parallel_size=2).pipeline_parallel


class _Buckets:
    """Batches of two latent sizes, alternating (as Energon's buckets do), the same on every rank."""

    def __new__(cls):
        import lightning as L

        class Buckets(L.LightningDataModule):
            def train_dataloader(self):
                g = torch.Generator().manual_seed(0)
                batches = []
                for i in range(8):
                    t, h, w = ((2, 4, 4), (1, 4, 6))[i % 2]
                    batches.append({"latents": torch.randn(2, 4, t, h, w, generator=g),
                                    "context": torch.randn(2, 3, 16, generator=g),
                                    "context_mask": torch.ones(2, 3, dtype=torch.bool)})
                return torch.utils.data.DataLoader(batches, batch_size=None)

        return Buckets()


def _fit_buckets(rank, world, strategy_kw):
    """Per-step losses of 4 steps over alternating latent sizes (rank 0)."""
    import lightning as L

    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.lightning.module import DiffusionModule, OptimConfig

    class Losses(L.Callback):
        values: list = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.values.append(float(outputs["loss"]))

    torch.manual_seed(7)
    module = DiffusionModule(_config("dit"), EDM(), OptimConfig(lr=0.5, eps=10.0, warmup_steps=0), ema_decay=None,
                             seed=7)
    strategy = VFMParallelStrategy(**strategy_kw) if strategy_kw else "auto"
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=world, strategy=strategy, precision="32-true",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False, callbacks=[Losses()])
    trainer.fit(module, datamodule=_Buckets())
    return Losses.values if rank == 0 else None


def test_pp_follows_changing_batch_shapes_like_one_process():
    """A schedule sizes its P2P buffers at its first step: a new latent size gets its own runner."""
    want = _fit_buckets(0, 1, None)
    got = run_distributed(_fit_buckets, 2, dict(pipeline_model_parallel_size=2, **FP32))[0]
    assert len(got) == len(want) == 4
    assert got == pytest.approx(want, rel=1e-5), (got, want)
