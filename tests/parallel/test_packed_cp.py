"""Packed (THD) batches and token counts that do not divide CP/SP train like one process.

Packed: four images/videos of different grids in one THD sequence of 32 tokens whose segments straddle
the CP cuts (``equivalence.make_packed_problem``). Padded: 3x3x5 = 45 latent tokens per sample, padded
to 46 (CP2, SP2) or 48 (CP4, CP2 x SP2). Losses, gradient norms, gradients (3 SGD steps) and final
weights are compared with the single-process run (also under activation checkpointing, whose recompute
re-runs the block hooks); one spawn per world size runs all of its cases.
"""

import pytest
from gloo_launcher import run_distributed

from bench import equivalence as E

PADDED_LATENT = (3, 6, 10)  # patch (1, 2, 2) -> 3x3x5 = 45 tokens
CASES_2 = {
    "DiT packed CP2 ring": ("dit", "packed", dict(cp=2)),
    "DiT packed CP2 all-to-all": ("dit", "packed", dict(cp=2, cp_kind="a2a")),
    "DiT packed SP+TP2": ("dit", "packed", dict(tp=2, sequence_parallel=True)),
    "DiT padded CP2 ring": ("dit", "padded", dict(cp=2)),
    "DiT padded CP2 all-to-all": ("dit", "padded", dict(cp=2, cp_kind="a2a")),
    "DiT padded SP+TP2": ("dit", "padded", dict(tp=2, sequence_parallel=True)),
    "MovieGen packed CP2 ring": ("moviegen", "packed", dict(cp=2)),
    "MovieGen padded CP2 all-to-all": ("moviegen", "padded", dict(cp=2, cp_kind="a2a")),
    "ST-DiT packed SP+TP2": ("stdit", "packed", dict(tp=2, sequence_parallel=True)),
    "DiT packed CP2 ring + full AC": ("dit", "packed", dict(cp=2, activation_checkpointing="full")),
    "DiT padded SP+TP2 + selective-op AC": ("dit", "padded", dict(tp=2, sequence_parallel=True,
                                                                  activation_checkpointing="selective_op")),
}
CASES_4 = {
    "DiT packed SP+TP2xCP2 ring": ("dit", "packed", dict(tp=2, cp=2, sequence_parallel=True)),
    "DiT packed CP4 ring": ("dit", "packed", dict(cp=4)),
    "DiT padded CP4 ring": ("dit", "padded", dict(cp=4)),
    "DiT padded SP+TP2xCP2 all-to-all": ("dit", "padded", dict(tp=2, cp=2, sequence_parallel=True, cp_kind="a2a")),
}


def _config(family):
    if family == "dit":
        return E.tiny_config()
    if family == "moviegen":
        from nemo_vfm.models.moviegen.flavors import moviegen_config

        return moviegen_config("tiny", in_channels=4, context_dim=32)
    from nemo_vfm.models.stdit.flavors import stdit_config

    return stdit_config("tiny", in_channels=4, context_dim=32)


def _problem(family, kind):
    cfg = _config(family)
    return cfg, (E.make_packed_problem(cfg) if kind == "packed" else E.make_problem(cfg, latent=PADDED_LATENT))


def _worker(rank, world, cases):
    from nemo_vfm.parallel.dims import ParallelDims

    out = {}
    for name, (family, kind, kw) in cases.items():
        cfg, problem = _problem(family, kind)
        dims = {k: v for k, v in kw.items() if k != "activation_checkpointing"}
        extra = {k: v for k, v in kw.items() if k == "activation_checkpointing"}
        out[name] = E.run_layout(cfg, problem, ParallelDims(world_size=world, **dims), **extra)
    return out


@pytest.fixture(scope="module")
def references():
    pairs = {(f, k) for f, k, _ in (*CASES_2.values(), *CASES_4.values())}
    return {pair: E.run_reference(*_problem(*pair)) for pair in pairs}


def _check(results, references, cases):
    failures = {}
    for name, (family, kind, _) in cases.items():
        errs = E.compare(references[family, kind], E.merge_ranks([r[name] for r in results]))
        if not (errs["loss"] < 1e-5 and errs["norm"] < 1e-5 and errs["grads"] < 1e-4 and errs["params"] < 1e-5):
            failures[name] = errs
    assert not failures, failures


def test_two_process_packed_and_padded_match_single_process(references):
    _check(run_distributed(_worker, 2, CASES_2), references, CASES_2)


def test_four_process_packed_and_padded_match_single_process(references):
    _check(run_distributed(_worker, 4, CASES_4), references, CASES_4)


def _errors_worker(rank, world):
    """The messages of the cases that cannot run: ST-DiT packed under CP, a packed length that does not divide."""
    import torch

    from nemo_vfm.parallel.dims import ParallelDims

    msgs = {}
    for name, family, pad in (("stdit", "stdit", 4), ("indivisible", "dit", 1)):
        cfg = _config(family)
        problem = E.make_packed_problem(cfg, pad_to_multiple=pad)  # pad 1: 25 tokens
        try:
            E.run_layout(cfg, problem, ParallelDims(world_size=world, cp=2), steps=1)
        except (NotImplementedError, ValueError) as e:
            msgs[name] = f"{type(e).__name__}: {e}"
    torch.distributed.barrier()
    return msgs


def test_unsupported_packed_cases_name_the_fix():
    msgs = run_distributed(_errors_worker, 2)[0]
    assert "NotImplementedError" in msgs["stdit"] and "ST-DiT" in msgs["stdit"], msgs
    assert "packed batch of 25 tokens" in msgs["indivisible"] and "cp*tp(sp) = 2" in msgs["indivisible"], msgs
    assert "pad_to_multiple" in msgs["indivisible"], msgs


def _train_packed(rank, world, root, strategy_kw):
    """Three steps of ``train()`` (AdamW) on one packed batch, repeated; returns the last loss."""
    import lightning as L

    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    class PackedData(L.LightningDataModule):
        latent_shape, context_dim, fps, batch_size, max_seq_length = (4, 3, 4, 4), 32, None, 1, 32
        missing_class_samples, tokenizer_spec, text_encoder_spec, captions = 0, None, None, []

        def build_encoders(self):
            return None

        def train_dataloader(self):
            from torch.utils.data import DataLoader

            return DataLoader([E.make_packed_problem(E.tiny_config())["packed"]] * 4, batch_size=None)

    strategy = VFMParallelStrategy(**strategy_kw) if strategy_kw else "auto"
    trainer = TrainerConfig(max_steps=3, devices=world, accelerator="cpu", precision="32-true", strategy=strategy,
                            log_every_n_steps=1, checkpoint_every_n_steps=5, enable_progress_bar=False)
    return train(model=E.tiny_config(), data=PackedData(), trainer=trainer, ema_decay=None, cond_dropout=0.5,
                 log=ExperimentConfig(name="packed", root=root, tensorboard=False))["loss"]


def test_strategy_trains_packed_batches_under_cp_like_one_process(tmp_path):
    """The Lightning path: noise and condition dropout drawn alike on CP peers, the model's CP hooks."""
    single = _train_packed(0, 1, str(tmp_path / "single"), None)
    kw = dict(context_parallel_size=2, fsdp=False, param_dtype=None)
    parallel = run_distributed(_train_packed, 2, str(tmp_path / "cp2"), kw)
    assert parallel[0] == pytest.approx(single, rel=1e-5) and parallel[1] == pytest.approx(single, rel=1e-5)
