"""LTX-2 under TP2, FSDP2, FSDP2 + full activation checkpointing, ring CP2, all-to-all CP2 and CP2 x FSDP2 gives the loss (video and audio), every gradient
and the weights after one SGD step of one process (gloo, CPU). The video has 15 tokens and 10 IC-LoRA reference tokens, so CP pads one; the audio
stream is replicated on the CP ranks and attends to the video keys of all of them. Sequence and pipeline parallelism
are refused by ``check_layout``."""

import pytest
import torch
from gloo_launcher import run_distributed

from bench import equivalence as E

GROUPS = {"tp_fsdp": {"TP2": dict(tp=2), "FSDP2": dict(), "FSDP2 + full AC": dict(activation_checkpointing="full")},
          "cp": {"CP2 ring": dict(cp=2), "CP2 a2a": dict(cp=2, cp_kind="a2a"), "CP2 ring x FSDP2": dict(cp=2, fsdp=True)}}
LR = 0.5


def cfg():
    from nemo_vfm.models.ltx2.model import LTX2Config

    return LTX2Config(num_layers=2, num_heads=2, head_dim=8, in_channels=4, out_channels=4, audio_num_heads=2,
                      audio_head_dim=6, audio_in_channels=6, audio_out_channels=6, audio_mel_bins=3,
                      caption_channels=10, rope_type="split", gated_attn=True, audio_gated_attn=True)


def problem():
    torch.manual_seed(0)
    model = cfg().build()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(2, 5)
    mask[0, 3:] = 0
    batch = {"x": torch.randn(2, 4, 3, 5, 1, generator=g), "t": torch.rand(2, generator=g),
             "context": torch.randn(2, 5, 10, generator=g), "context_mask": mask,
             "audio": torch.randn(2, 2, 7, 3, generator=g), "audio_t": torch.rand(2, generator=g),
             "audio_context": torch.randn(2, 5, 10, generator=g),
             "reference": torch.randn(2, 4, 2, 5, 1, generator=g)}  # IC-LoRA tokens: 15 + 10, padded under CP2
    batch["target"] = torch.randn(batch["x"].shape, generator=g)
    batch["audio_target"] = torch.randn(batch["audio"].shape, generator=g)
    return {"state": {k: v.clone() for k, v in model.state_dict().items()}, "latent": (3, 5, 1)}, batch


def loss_of(model, b):
    v, a = model(b["x"], b["t"], b["context"], b["context_mask"], audio=b["audio"], audio_timesteps=b["audio_t"],
                 audio_context=b["audio_context"], audio_context_mask=b["context_mask"], reference_latents=b["reference"])
    return ((v - b["target"]) ** 2).mean() + 0.5 * ((a - b["audio_target"]) ** 2).mean()


def _worker(rank, world, layouts):
    from nemo_vfm.models.ltx2 import family as P
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.grads import split_dtensor_groups, sync_grads

    prob, b = problem()
    out = {}
    for name, kw in layouts.items():
        dims = ParallelDims(world_size=world, **{k: v for k, v in kw.items() if k != "activation_checkpointing"})
        extra = {k: v for k, v in kw.items() if k == "activation_checkpointing"}
        pmesh, modules, _ = E.build_parallel(cfg(), prob, dims, torch.device("cpu"), param_dtype=None,
                                             reduce_dtype=None, **extra)
        model = modules[0]
        gathered = sum(isinstance(m, P.GatheredKeysCore) for m in model.modules())
        assert gathered == (cfg().num_layers if dims.cp > 1 else 0), (name, gathered)
        loss = loss_of(model, b)
        loss.backward()
        sync_grads(model, pmesh, tp_partial=P.TP_PARTIAL)
        grads = E._collect(modules, "grad")
        torch.optim.SGD(split_dtensor_groups([{"params": list(model.parameters())}]), lr=LR).step()
        out[name] = (loss.item(), grads, E._collect(modules, "param"))
    return out


def _reference():
    prob, b = problem()
    model = cfg().build("meta").to_empty(device="cpu")
    model.load_state_dict(prob["state"])
    loss = loss_of(model, b)
    loss.backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return loss.item(), ref, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("group", list(GROUPS))
def test_layouts_match_one_process(group):
    loss, ref, params = _reference()
    for out in run_distributed(_worker, 2, GROUPS[group]):
        for name, (got_loss, grads, got_params) in out.items():
            assert abs(got_loss - loss) <= 1e-5 * loss, name
            for n, g in ref.items():
                assert (grads[n] - g).abs().max() <= 1e-4 * g.abs().max().clamp_min(1e-8), (name, n)
            for n, p in params.items():
                assert (got_params[n] - p).abs().max() <= 1e-5 * p.abs().max().clamp_min(1e-8), (name, n)


@pytest.mark.parametrize("kw,match", [
    (dict(pp=2), "pipeline-parallel"),
    (dict(tp=2, sequence_parallel=True), "sequence parallelism"),
    (dict(tp=4), r"audio_num_heads=2 must be divisible by tp=4"),
])
def test_refused_layouts_name_the_fix(kw, match):
    from nemo_vfm.models.ltx2.family import check_layout
    from nemo_vfm.parallel.dims import ParallelDims

    with pytest.raises((ValueError, NotImplementedError), match=match):
        check_layout(cfg(), ParallelDims(world_size=8, **kw))


def _load_worker(rank, world, folder):
    from torch.distributed.tensor import DTensor

    from nemo_vfm.models.ltx2 import family as P
    from nemo_vfm.models.ltx2.weights import load_weights
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.mesh import build_mesh

    out = {}
    for name, kw in {"FSDP2": {}, "TP2": dict(tp=2)}.items():
        model = P.SPEC.parallelize(cfg().build("meta"), build_mesh(ParallelDims(world_size=world, **kw)),
                                   param_dtype=None, reduce_dtype=None)
        model.to_empty(device="cpu")
        load_weights(model, folder)
        assert any(isinstance(p, DTensor) for p in model.parameters())
        out[name] = {k: (v.full_tensor() if isinstance(v, DTensor) else v).clone() for k, v in model.state_dict().items()}
    return out


@pytest.mark.parametrize("layout", ["diffusers", "original"])
def test_a_weights_folder_streams_into_sharded_models(tmp_path, layout):
    from nemo_vfm.models.ltx2.convert import save_weights

    prob, _ = problem()
    save_weights(prob["state"], tmp_path, cfg(), layout=layout)
    for loaded in run_distributed(_load_worker, 2, str(tmp_path)):
        for name, state in loaded.items():
            for k, v in prob["state"].items():
                assert torch.equal(state[k], v), (name, k)
