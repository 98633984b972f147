"""The Lightning strategy trains the real module through ``train()`` on 2 gloo processes, writes
sharded checkpoints, resumes from them, and rejects bad layouts before building the model."""

import pytest
from gloo_launcher import run_distributed

from nemo_vfm.lightning.strategy import VFMParallelStrategy


def _train(rank, world, root, max_steps, strategy_kw):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    model = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=4, context_dim=16, adaln_lora_rank=4)
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16,
                                context_length=3, batch_size=2, num_samples=8)
    trainer = TrainerConfig(max_steps=max_steps, devices=world, accelerator="cpu", precision="32-true",
                            strategy=VFMParallelStrategy(**strategy_kw), log_every_n_steps=1,
                            checkpoint_every_n_steps=2, enable_progress_bar=False)
    return train(model=model, data=data, trainer=trainer, log=ExperimentConfig(name="s", root=root, tensorboard=False),
                 ema_decay=0.9)


@pytest.mark.slow
def test_cp_tp_training_checkpoints_and_resumes(tmp_path):
    kw = dict(context_parallel_size=2, param_dtype=None)
    first = run_distributed(_train, 2, str(tmp_path), 2, kw)[0]
    assert first["step"] == 2 and first["loss"] is not None
    ckpt = tmp_path / "s" / "checkpoints"
    assert any((p / ".metadata").exists() for p in ckpt.iterdir() if p.is_dir())  # a sharded DCP folder
    # resume under a different layout: tensor parallel instead of context parallel
    second = run_distributed(_train, 2, str(tmp_path), 3, dict(tensor_model_parallel_size=2, sequence_parallel=True,
                                                               param_dtype=None))[0]
    assert second["step"] == 3


def _ema_starts_as_the_model(rank, world, root):
    """Train one step under FSDP with an EMA; at train start the EMA's local shards equal the model's (the EMA is a
    meta copy filled from the laid-out model, never a second full network on the host)."""
    import lightning as L
    import torch
    from torch.distributed.tensor import DTensor

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    local = lambda t: t.to_local() if isinstance(t, DTensor) else t
    seen = []

    class Check(L.Callback):
        def on_train_start(self, trainer, module):
            pairs = list(zip(module.ema.named_parameters(), module.model.parameters()))
            assert pairs and all(torch.equal(local(e), local(m)) for (_, e), m in pairs)
            assert not any(e.is_meta for _, e in module.ema.named_parameters())
            seen.append(type(module.model.blocks[0].attn.q.weight).__name__)

    model = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=4, context_dim=16, adaln_lora_rank=4)
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16,
                                context_length=3, batch_size=2, num_samples=8)
    trainer = TrainerConfig(max_steps=1, devices=world, accelerator="cpu", precision="32-true", callbacks=[Check()],
                            strategy=VFMParallelStrategy(param_dtype=None), enable_progress_bar=False)
    train(model=model, data=data, trainer=trainer, log=ExperimentConfig(name="e", root=root, tensorboard=False),
          ema_decay=0.9)
    return seen


def test_ema_copy_is_filled_from_the_laid_out_model(tmp_path):
    assert run_distributed(_ema_starts_as_the_model, 2, str(tmp_path)) == [["DTensor"], ["DTensor"]]


def test_the_module_builds_its_ema_on_meta_where_the_strategy_fills_it():
    """Under a strategy that fills the EMA (VFMParallelStrategy without pipeline stages) no second network is
    allocated; elsewhere (Lightning's own strategies, pipeline stages) the EMA is a full copy."""
    import types

    from nemo_vfm.lightning.module import DiffusionModule
    from nemo_vfm.models.dit.model import DiTConfig

    cfg = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=4, context_dim=None)
    assert VFMParallelStrategy().fills_ema and not VFMParallelStrategy(pipeline_model_parallel_size=2).fills_ema
    for fills in (True, False):
        module = DiffusionModule(cfg, objective=None, ema_decay=0.9)
        module._trainer = types.SimpleNamespace(strategy=types.SimpleNamespace(fills_ema=fills))
        module.configure_model()
        assert all(p.is_meta == fills for p in module.ema.parameters())
        assert not any(p.is_meta for p in module.model.parameters())


def test_meta_copy_allocates_nothing_and_keeps_shared_tensors():
    import torch

    from nemo_vfm.parallel.materialize import meta_copy

    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    net[1].weight = net[0].weight
    copy = meta_copy(net)
    assert all(p.is_meta for p in copy.parameters()) and copy[1].weight is copy[0].weight
    assert not any(p.is_meta for p in net.parameters()) and copy[0].weight.requires_grad


def fit_error_and_builds(strategy, devices: int = 1) -> tuple[ValueError, int]:
    """Fit a 2-block DiT on the CPU with ``strategy``; the ``ValueError`` it raises and how often the network was
    built before it."""
    import lightning as L

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.lightning.module import DiffusionModule
    from nemo_vfm.models.dit.model import DiTConfig

    built = []

    class Cfg(DiTConfig):
        def build(self, device=None):
            built.append(1)
            return super().build(device)

    module = DiffusionModule(Cfg(num_layers=2, hidden_size=48, num_heads=6, in_channels=4, context_dim=None),
                             objective=None)
    trainer = L.Trainer(devices=devices, accelerator="cpu", strategy=strategy, max_steps=1, logger=False,
                        enable_checkpointing=False)
    with pytest.raises(ValueError) as e:
        trainer.fit(module, datamodule=MockLatentDataModule(latent_channels=4, context_dim=None))
    return e.value, len(built)


def test_bad_layout_fails_before_the_model_is_built(monkeypatch):
    """2 processes cannot hold TP4: the error comes before any process group or model exists."""
    import torch

    monkeypatch.setenv("LOCAL_RANK", "0")  # as if launched by torchrun: Lightning spawns nothing
    error, built = fit_error_and_builds(VFMParallelStrategy(tensor_model_parallel_size=4), devices=2)
    assert "world size 2" in str(error) and "4" in str(error), str(error)
    assert not built and not torch.distributed.is_initialized()


def test_knobs_checked_at_construction():
    with pytest.raises(ValueError, match="sequence_parallel"):
        VFMParallelStrategy(sequence_parallel=True)
    with pytest.raises(ValueError, match="pp_microbatches"):
        VFMParallelStrategy(pipeline_model_parallel_size=2, microbatches=0)


def _clipped_fsdp_loss(rank, world, root, fused):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    model = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=4, context_dim=16)
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16,
                                context_length=3, batch_size=2, num_samples=8)
    trainer = TrainerConfig(max_steps=3, devices=world, accelerator="cpu", precision="32-true",
                            strategy=VFMParallelStrategy(param_dtype=None), log_every_n_steps=1,
                            checkpoint_every_n_steps=10, enable_progress_bar=False, gradient_clip_val=1e-3)
    return train(model=model, data=data, trainer=trainer, optim=OptimConfig(lr=1e-2, warmup_steps=0, fused=fused),
                 log=ExperimentConfig(name="c", root=root, tensorboard=False), ema_decay=None)["loss"]


def test_fsdp2_fused_adamw_clips_through_grad_scale(tmp_path):
    """FSDP2 over 2 gloo processes: the fused AdamW's in-kernel clipping (``grad_scale``, a plain 0-d tensor beside
    DTensor parameters) trains exactly like the unfused AdamW with gradients clipped in place."""
    fused = run_distributed(_clipped_fsdp_loss, 2, str(tmp_path / "fused"), True)
    plain = run_distributed(_clipped_fsdp_loss, 2, str(tmp_path / "plain"), False)
    assert fused == pytest.approx(plain, rel=1e-5)  # each rank's loss of step 3


def _weights_at_train_start(rank, world, root, strategy_kw):
    """The full weights and buffers as training starts, and whether this rank built its network on meta."""
    import lightning as L
    import torch
    from torch.distributed.tensor import DTensor

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.parallel.grads import clean_name
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    seen = {}

    class Capture(L.Callback):
        def on_train_start(self, trainer, module):
            full = lambda t: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()
            named = list(module.model.named_parameters()) + list(module.model.named_buffers())
            seen["tensors"] = {clean_name(n): full(t) for n, t in named}
            seen["meta_build"] = trainer.strategy.builds_meta(module.model_config)
            seen["rng"] = torch.get_rng_state()

    model = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=4, context_dim=16, adaln_lora_rank=4)
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16,
                                context_length=3, batch_size=2, num_samples=8)
    trainer = TrainerConfig(max_steps=1, devices=world, accelerator="cpu", precision="32-true", callbacks=[Capture()],
                            strategy=VFMParallelStrategy(param_dtype=None, **strategy_kw), enable_progress_bar=False)
    train(model=model, data=data, trainer=trainer, log=ExperimentConfig(name="w", root=root, tensorboard=False),
          ema_decay=0.9)
    return seen


def test_a_network_from_scratch_is_initialised_by_rank_0_alone(tmp_path):
    """Several processes: only rank 0 builds and initialises the network; the others build it on meta and receive
    each tensor once it is laid out, so the weights at train start are the one-process weights, in every layout."""
    import torch

    one = run_distributed(_weights_at_train_start, 1, str(tmp_path / "one"), {})[0]
    assert not one["meta_build"]
    for kw in ({}, {"tensor_model_parallel_size": 2}):  # FSDP2 over 2; TP2
        ranks = run_distributed(_weights_at_train_start, 2, str(tmp_path / f"two{len(kw)}"), kw)
        assert [r["meta_build"] for r in ranks] == [False, True]
        assert torch.equal(ranks[0]["rng"], ranks[1]["rng"])  # rank 0's random state after its initialisation
        for r in ranks:
            assert r["tensors"].keys() == one["tensors"].keys()
            bad = [n for n, t in one["tensors"].items() if not torch.equal(r["tensors"][n], t)]
            assert not bad, (kw, bad)


def test_fill_from_rank0_refuses_a_network_rank_0_does_not_have(tmp_path):
    assert run_distributed(_mismatched_fill, 2) == ["refused", "refused"]


def _mismatched_fill(rank, world):
    import torch

    from nemo_vfm.parallel.materialize import fill_from_rank0, take_tensors

    net = torch.nn.Linear(3, 4)
    tensors = take_tensors(torch.nn.Linear(3, 5)) if rank == 0 else {}  # rank 0 built another shape
    try:
        fill_from_rank0(net, tensors, torch.device("cpu"))
    except RuntimeError as e:
        assert "does not match the laid-out one" in str(e) and ("weight" in str(e) or rank)
        return "refused"
    return "filled"
