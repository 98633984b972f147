"""HunyuanVideo under TP2, FSDP2, FSDP2 + full activation checkpointing, all-to-all CP2 (alone, with FSDP2 over the CP
ranks, and with TP2 in 4 processes) gives the loss, every gradient and the weights after one SGD step of one process
(gloo, CPU; I2V inputs with glyph tokens and a masked prompt; 27 video tokens, so CP pads one), and a weights folder
loads into the sharded models. Ring CP and SP are refused by ``check_layout`` (also tests/models/test_hunyuan_spec.py).

Under CP the text stream is replicated: its parameters' gradients agree with one process only if the all-gather of
the text attention output over heads sums the ranks' gradients in backward (``cp x`` the share on each rank, then
the mean over dp x cp), which the CP layouts check."""

import pytest
import torch
from gloo_launcher import run_distributed

from bench import equivalence as E

A2A = dict(cp=2, cp_kind="a2a")
LAYOUTS = {"TP2": dict(tp=2), "FSDP2": dict(), "FSDP2 + full AC": dict(activation_checkpointing="full"),
           "TP2 + full AC": dict(tp=2, activation_checkpointing="full"), "CP2 a2a": A2A,
           "CP2 a2a x FSDP2": dict(A2A, fsdp=True), "CP2 a2a + full AC": dict(A2A, activation_checkpointing="full")}
LAYOUTS_4 = {"CP2 a2a x TP2": dict(A2A, tp=2)}
_AC = ("activation_checkpointing",)
LR = 0.5


def cfg():
    from nemo_vfm.models.hunyuan.model import HunyuanVideoConfig

    return HunyuanVideoConfig(num_layers=2, hidden_size=32, num_heads=4, num_refiner_layers=1, in_channels=9,
                              out_channels=4, text_dim=16, glyph_dim=8, glyph_hidden=16, image_dim=12,
                              rope_axes_dim=(2, 2, 4))


def problem():
    torch.manual_seed(0)
    model = cfg().build()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[0, 3:] = False
    batch = {"x": torch.randn(2, 4, 3, 3, 3, generator=g), "t": torch.rand(2, generator=g),
             "context": torch.randn(2, 5, 16, generator=g), "context_mask": mask,
             "glyph_context": torch.randn(2, 3, 8, generator=g), "image_embeds": torch.randn(2, 4, 12, generator=g),
             "cond_latents": torch.randn(2, 5, 3, 3, 3, generator=g), "target": torch.randn(2, 4, 3, 3, 3, generator=g)}
    return {"state": {k: v.clone() for k, v in model.state_dict().items()}, "latent": (3, 3, 3)}, batch


def loss_of(model, b):
    out = model(b["x"], b["t"], b["context"], b["context_mask"], image_embeds=b["image_embeds"],
                cond_latents=b["cond_latents"], glyph_context=b["glyph_context"])
    return ((out - b["target"]) ** 2).mean()


def _worker(rank, world, layouts, folder):
    from torch.distributed.tensor import DTensor

    from nemo_vfm.models.hunyuan import family as P
    from nemo_vfm.models.hunyuan.convert import load_weights
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.grads import split_dtensor_groups, sync_grads
    from nemo_vfm.parallel.joint_context_parallel import JointContextParallelCore
    from nemo_vfm.parallel.mesh import build_mesh

    prob, b = problem()
    out = {}
    for name, kw in layouts.items():
        dims = ParallelDims(world_size=world, **{k: v for k, v in kw.items() if k not in _AC})
        extra = {k: v for k, v in kw.items() if k in _AC}
        pmesh, modules, _ = E.build_parallel(cfg(), prob, dims, torch.device("cpu"), param_dtype=None,
                                             reduce_dtype=None, **extra)
        model = modules[0]
        cores = sum(isinstance(m, JointContextParallelCore) for m in model.modules())
        assert cores == (cfg().num_layers if dims.cp > 1 else 0), (name, cores)
        loss = loss_of(model, b)
        loss.backward()
        sync_grads(model, pmesh, tp_partial=P.TP_PARTIAL)
        grads = E._collect(modules, "grad")
        torch.optim.SGD(split_dtensor_groups([{"params": list(model.parameters())}]), lr=LR).step()
        out[name] = (loss.item(), grads, E._collect(modules, "param"))
    loaded = {}
    for name, kw in ({"FSDP2": {}, "TP2": dict(tp=2)} if folder else {}).items():
        model = P.SPEC.parallelize(cfg().build("meta"), build_mesh(ParallelDims(world_size=world, **kw)),
                                      param_dtype=None, reduce_dtype=None)
        model.to_empty(device="cpu")
        load_weights(model, folder)
        assert any(isinstance(p, DTensor) for p in model.parameters())
        loaded[name] = {k: (v.full_tensor() if isinstance(v, DTensor) else v).clone()
                        for k, v in model.state_dict().items()}
    return out, loaded


def _reference():
    prob, b = problem()
    model = cfg().build("meta").to_empty(device="cpu")
    model.load_state_dict(prob["state"])
    loss = loss_of(model, b)
    loss.backward()
    # the last block's text-stream output is unused (as in the release): its txt q / proj / mlp get no gradient
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert sum(g.abs().max() > 0 for g in ref.values()) >= len(list(model.parameters())) - 9
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return prob, loss.item(), ref, {n: p.detach().clone() for n, p in model.named_parameters()}


def _check(results, loss, ref, params):
    for out, _ in results:
        for name, (got_loss, grads, got_params) in out.items():
            assert abs(got_loss - loss) <= 1e-5 * loss, name
            for n, g in ref.items():
                assert (grads[n] - g).abs().max() <= 1e-4 * g.abs().max().clamp_min(1e-8), (name, n)
            for n, p in params.items():
                assert (got_params[n] - p).abs().max() <= 1e-5 * p.abs().max().clamp_min(1e-8), (name, n)


def test_layouts_match_one_process(tmp_path):
    from nemo_vfm.models.hunyuan.convert import save_weights

    prob, loss, ref, params = _reference()
    save_weights(prob["state"], tmp_path, cfg())
    results = run_distributed(_worker, 2, LAYOUTS, str(tmp_path))
    _check(results, loss, ref, params)
    for _, loaded in results:
        for name, state in loaded.items():
            for k, v in prob["state"].items():
                assert torch.equal(state[k], v), (name, k)


def test_cp_with_tp_matches_one_process():
    _, loss, ref, params = _reference()
    _check(run_distributed(_worker, 4, LAYOUTS_4, ""), loss, ref, params)


@pytest.mark.parametrize("kw,match", [
    (dict(cp=2), r"ring context parallelism.*context_parallel_kind='a2a'"),
    (dict(cp=8, cp_kind="a2a"), r"heads per TP rank \(4/1 = 4\) divisible by cp=8"),
    (dict(cp=2, cp_kind="a2a", tp=2, sequence_parallel=True), "sequence parallelism"),
])
def test_refused_cp_layouts_name_the_fix(kw, match):
    from nemo_vfm.models.hunyuan.family import check_layout
    from nemo_vfm.parallel.dims import ParallelDims

    with pytest.raises((ValueError, NotImplementedError), match=match):
        check_layout(cfg(), ParallelDims(world_size=8, **kw))
