"""VFMParallelStrategy picks each model family's own plan and passes it its knobs: ST-DiT under hybrid CP2,
MovieGen under TP2 + SP and Wan under CP2 train through ``train()`` with the same first-step loss as a single
process."""

import pytest
from gloo_launcher import run_distributed

from nemo_vfm.lightning.strategy import VFMParallelStrategy, family_spec


def _config(family):
    if family == "wan":
        from nemo_vfm.models.wan.model import WanConfig

        return WanConfig(num_layers=2, hidden_size=48, num_heads=4, ffn_size=64, in_channels=4, out_channels=4,
                         context_dim=16, freq_dim=16, text_len=4)
    if family == "stdit":
        from nemo_vfm.models.stdit.model import STDiTConfig

        return STDiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=4, context_dim=16,
                           patch_size=(1, 2, 2))
    from nemo_vfm.models.moviegen.model import MovieGenConfig

    return MovieGenConfig(num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, in_channels=4, context_dim=16,
                          patch_size=(1, 2, 2), max_grid=(4, 4, 4))


def _train(rank, world, root, family, strategy_kw):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    data = MockLatentDataModule(latent_channels=4, num_frames=4, height=4, width=4, context_dim=16,
                                context_length=3, batch_size=2, num_samples=8)
    strategy = VFMParallelStrategy(**strategy_kw) if strategy_kw else "auto"
    trainer = TrainerConfig(max_steps=1, devices=world, accelerator="cpu", precision="32-true", strategy=strategy,
                            log_every_n_steps=1, checkpoint_every_n_steps=5, enable_progress_bar=False,
                            gradient_clip_val=None)
    return train(model=_config(family), data=data, trainer=trainer, ema_decay=None,
                 log=ExperimentConfig(name=family, root=root, tensorboard=False))["loss"]


def test_family_spec_lookup_and_knobs():
    import nemo_vfm.models.dit.family as dit_plan
    import nemo_vfm.models.stdit.family as stdit_plan
    import nemo_vfm.models.wan.family as wan_plan
    from nemo_vfm.models.dit.model import DiTConfig

    assert family_spec(DiTConfig(num_layers=1, hidden_size=32, num_heads=4)) is dit_plan.SPEC
    assert family_spec(_config("stdit")) is stdit_plan.SPEC and family_spec(_config("wan")) is wan_plan.SPEC
    strategy = VFMParallelStrategy(activation_checkpointing="full", param_dtype=None)
    for family in ("dit", "stdit", "moviegen", "wan"):
        spec = family_spec(DiTConfig(num_layers=1, hidden_size=32, num_heads=4) if family == "dit" else _config(family))
        knobs = strategy.family_knobs(spec)  # exactly the knobs the family declares
        assert knobs.keys() == spec.knobs and knobs["activation_checkpointing"] == "full", family
        assert knobs["param_dtype"] is None, family


def test_a_knob_the_family_does_not_read_fails_naming_it():
    spec = family_spec(_config("stdit"))
    with pytest.raises(ValueError, match=r"stdit family does not read fuse_qkv=False"):
        VFMParallelStrategy(fuse_qkv=False).family_knobs(spec)  # ST-DiT has no fused q/k/v
    with pytest.raises(ValueError, match=r"does not read factorized_context_parallel='ring'.*fsdp_reshard_after_forward"):
        VFMParallelStrategy(factorized_context_parallel="ring").family_knobs(family_spec(_config("wan")))
    assert "fuse_qkv" not in VFMParallelStrategy().family_knobs(spec)  # at its default: passed over silently
    with pytest.raises(ValueError, match=r"does not read factorized_context_parallel_chunks=2"):
        VFMParallelStrategy(factorized_context_parallel_chunks=2, context_parallel_size=2).family_knobs(
            family_spec(_config("wan")))
    knobs = VFMParallelStrategy(factorized_context_parallel_chunks=2, context_parallel_size=2).family_knobs(spec)
    assert knobs["factorized_context_parallel_chunks"] == 2
    a2a = dict(context_parallel_a2a_chunks=2, context_parallel_size=2, context_parallel_kind="a2a")
    with pytest.raises(ValueError, match=r"does not read context_parallel_a2a_chunks=2"):  # its cores do not pipeline
        VFMParallelStrategy(**a2a).family_knobs(spec)
    assert VFMParallelStrategy(**a2a).family_knobs(family_spec(_config("wan")))["context_parallel_a2a_chunks"] == 2


def test_stdit_head_groups_must_divide_the_heads_per_tp_rank():
    from nemo_vfm.models.stdit.family import check_layout
    from nemo_vfm.parallel.dims import ParallelDims

    cfg = _config("stdit")
    dims = ParallelDims(world_size=2, cp=2)
    check_layout(cfg, dims, factorized_context_parallel_chunks=cfg.num_heads)
    with pytest.raises(ValueError, match=r"factorized_context_parallel_chunks=3 must divide the \d+ attention heads"):
        check_layout(cfg, dims, factorized_context_parallel_chunks=3)


@pytest.mark.slow
@pytest.mark.parametrize("family, kw", [
    ("stdit", dict(context_parallel_size=2, factorized_context_parallel="hybrid", fsdp=False, param_dtype=None)),
    ("moviegen", dict(tensor_model_parallel_size=2, sequence_parallel=True, fsdp=False, param_dtype=None)),
    ("wan", dict(context_parallel_size=2, fsdp=False, param_dtype=None)),
])
def test_family_trains_like_one_process(tmp_path, family, kw):
    single = _train(0, 1, str(tmp_path / "single"), family, None)
    parallel = run_distributed(_train, 2, str(tmp_path / "parallel"), family, kw)
    assert parallel[0] == pytest.approx(single, rel=1e-5) and parallel[1] == pytest.approx(single, rel=1e-5)
