"""Kandinsky 6 under TP2, FSDP2, ring CP2 and all-to-all CP2 (alone and with FSDP2) gives the loss, every gradient and
the weights after one SGD step of one process (gloo, CPU), with the audio stream on (a joint video + audio loss;
under CP the audio-from-video cross-attention gathers the CP-split video keys), with image conditioning (the tail
frame), and video only (the layers it does not use frozen, as training builds them); sequence and pipeline
parallelism and a token count that does not divide cp are refused."""

import pytest
import torch
from gloo_launcher import run_distributed

from bench import equivalence as E

LAYOUTS = {"TP2": dict(tp=2), "FSDP2": dict(), "CP2 ring": dict(cp=2), "CP2 a2a": dict(cp=2, cp_kind="a2a"),
           "CP2 ring x FSDP2": dict(cp=2, fsdp=True)}
LR = 0.5


def cfg(train_all_layers=True):
    from nemo_vfm.models.kandinsky6.flavors import kandinsky6_config

    return kandinsky6_config("tiny", hidden_size=64, ffn_size=48, axes_dims=(4, 6, 6), time_dim=20,
                             audio_hidden_size=32, audio_ffn_size=24, audio_time_dim=12,
                             train_all_layers=train_all_layers)


def problem():
    torch.manual_seed(0)
    model = cfg().build()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[0, 3:] = False
    batch = {"x": torch.randn(2, 4, 2, 4, 4, generator=g), "t": torch.rand(2, generator=g),
             "context": torch.randn(2, 5, 16, generator=g), "context_mask": mask,
             "pooled": torch.randn(2, 8, generator=g), "audio": torch.randn(2, 5, 6, generator=g),
             "image": torch.randn(2, 4, 4, 4, generator=g), "target": torch.randn(2, 4, 2, 4, 4, generator=g),
             "audio_target": torch.randn(2, 5, 6, generator=g)}
    return {"state": {k: v.clone() for k, v in model.state_dict().items()}, "latent": (2, 4, 4)}, batch


def loss_of(model, b, mode):
    kw = dict(audio=None if mode == "video" else b["audio"], image_latents=b["image"] if mode == "image" else None)
    out = model(b["x"], b["t"], b["context"], b["context_mask"], b["pooled"], **kw)
    if mode == "video":
        return ((out - b["target"]) ** 2).mean()
    return ((out[0] - b["target"]) ** 2).mean() + ((out[1] - b["audio_target"]) ** 2).mean()


def _worker(rank, world, layouts, mode):
    from nemo_vfm.models.kandinsky6 import family as P
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.grads import split_dtensor_groups, sync_grads

    prob, b = problem()
    out = {}
    for name, kw in layouts.items():
        dims = ParallelDims(world_size=world, **kw)
        pmesh, modules, _ = E.build_parallel(cfg(mode != "video"), prob, dims, torch.device("cpu"), param_dtype=None,
                                             reduce_dtype=None)
        model = modules[0]
        gathers = sum(isinstance(m, P.GatherKeysCore) for m in model.modules())
        assert gathers == (cfg().num_layers if dims.cp > 1 else 0), (name, gathers)
        loss = loss_of(model, b, mode)
        loss.backward()
        sync_grads(model, pmesh, tp_partial=P.TP_PARTIAL)
        grads = E._collect(modules, "grad")
        torch.optim.SGD(split_dtensor_groups([{"params": list(model.parameters())}]), lr=LR).step()
        out[name] = (loss.item(), grads, E._collect(modules, "param"))
    return out


def _reference(mode):
    prob, b = problem()
    model = cfg(mode != "video").build("meta").to_empty(device="cpu")  # video only: unused layers frozen
    model.load_state_dict(prob["state"])
    loss = loss_of(model, b, mode)
    loss.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return loss.item(), ref, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode, names", [
    ("audio", ("TP2", "FSDP2")), ("audio", ("CP2 ring", "CP2 a2a", "CP2 ring x FSDP2")),
    ("image", ("TP2", "CP2 ring", "CP2 ring x FSDP2")), ("video", ("TP2", "CP2 ring", "CP2 ring x FSDP2")),
])
def test_layouts_match_one_process(mode, names):
    loss, ref, params = _reference(mode)
    for out in run_distributed(_worker, 2, {k: LAYOUTS[k] for k in names}, mode):
        for name, (got_loss, grads, got_params) in out.items():
            assert abs(got_loss - loss) <= 1e-5 * loss, name
            assert set(grads) >= set(ref), (name, sorted(set(ref) - set(grads)))
            for n, g in ref.items():
                assert (grads[n] - g).abs().max() <= 1e-4 * g.abs().max().clamp_min(1e-8), (name, n)
            for n, p in params.items():
                assert (got_params[n] - p).abs().max() <= 1e-5 * p.abs().max().clamp_min(1e-8), (name, n)


@pytest.mark.parametrize("kw,latent,match", [
    (dict(pp=2), None, "pipeline-parallel"),
    (dict(tp=2, sequence_parallel=True), None, "sequence parallelism"),
    (dict(tp=4), None, "audio stream's 2 heads"),
    (dict(cp=2), (3, 2, 2), "divisible"),
])
def test_refused_layouts_name_the_fix(kw, latent, match):
    from nemo_vfm.models.kandinsky6.family import check_layout
    from nemo_vfm.parallel.dims import ParallelDims

    with pytest.raises(ValueError, match=match):
        check_layout(cfg(), ParallelDims(world_size=8, **kw), latent)


def _train(rank, world, root, folder, strategy_kw):
    """One step of ``train()`` on mock latents with Qwen-width text and CLIP-width pooled text (``pooled_context``
    flows from the batch through the strategy into the network)."""
    import dataclasses

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    data = MockLatentDataModule(latent_channels=4, num_frames=4, height=4, width=4, context_dim=16, context_length=3,
                                pooled_dim=8, batch_size=2, num_samples=8)
    strategy = VFMParallelStrategy(**strategy_kw) if strategy_kw else "auto"
    trainer = TrainerConfig(max_steps=1, devices=world, accelerator="cpu", precision="32-true", strategy=strategy,
                            log_every_n_steps=1, checkpoint_every_n_steps=5, enable_progress_bar=False,
                            gradient_clip_val=None)
    return train(model=dataclasses.replace(cfg(), pretrained=folder, train_all_layers=False), data=data, trainer=trainer, ema_decay=None,
                 log=ExperimentConfig(name="k6", root=root, tensorboard=False))["loss"]


@pytest.mark.parametrize("kw", [dict(context_parallel_size=2), dict(tensor_model_parallel_size=2)])
def test_trains_through_the_strategy_like_one_process(tmp_path, kw):
    from nemo_vfm.models.kandinsky6.convert import save_weights

    prob, _ = problem()
    folder = str(save_weights(prob["state"], tmp_path / "k6", cfg()))
    kw = dict(kw, fsdp=False, param_dtype=None)
    single = _train(0, 1, str(tmp_path / "single"), folder, None)
    parallel = run_distributed(_train, 2, str(tmp_path / "parallel"), folder, kw)
    assert parallel[0] == pytest.approx(single, rel=1e-5) and parallel[1] == pytest.approx(single, rel=1e-5)
