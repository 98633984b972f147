"""FP8 linears (torchao): which layers convert, numerics close to bf16, errors before any work."""

import pytest
import torch
from torch import nn

from nemo_vfm.models.dit.flavors import dit_config
from nemo_vfm.parallel.float8 import apply_float8, check_float8


def _model(seed=0):
    torch.manual_seed(seed)
    return dit_config("tiny", in_channels=4, context_dim=32, adaln_lora_rank=16).build()


def _inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(2, 4, 2, 8, 8, generator=g), torch.rand(2, generator=g),
            {"context": torch.randn(2, 6, 32, generator=g)})


def _converted(model) -> set[str]:
    from torchao.float8.float8_linear import Float8Linear

    return {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}


def test_mlp_converts_only_the_block_mlps():
    model = _model()
    n = apply_float8(model.blocks, "rowwise", "mlp")
    got = _converted(model)
    assert n == len(got) == 2 * 2  # 2 blocks x (fc1, fc2)
    assert got == {f"blocks.{i}.mlp.{fc}" for i in range(2) for fc in ("fc1", "fc2")}


def test_all_adds_attention_projections_never_adaln_or_embedders():
    model = _model()
    apply_float8(model, "tensorwise", "all")
    got = _converted(model)
    assert {"blocks.0.attn.q", "blocks.0.attn.proj", "blocks.1.cross_attn.k", "blocks.1.mlp.fc2"} <= got
    assert not any("adaln" in n or "embed" in n or "final_layer" in n for n in got)
    assert type(model.blocks[0].adaln.up) is nn.Linear


def test_layers_not_divisible_by_16_stay_bf16():
    mlp = nn.Module()
    mlp.mlp = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 40))  # 40 is not a multiple of 16
    assert apply_float8(mlp, "rowwise", "mlp") == 1
    assert type(mlp.mlp[1]) is nn.Linear


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_fp8_forward_and_grads_close_to_bf16(recipe):
    x, t, cond = _inputs()
    ref, fp8 = _model().to(torch.bfloat16), _model().to(torch.bfloat16)
    for m in (ref, fp8):  # non-zero adaLN/out projections, so that every block matters
        for p in m.parameters():
            p.data.add_(0.02 * torch.randn_like(p))
    fp8.load_state_dict(ref.state_dict())
    apply_float8(fp8.blocks, recipe, "all")
    outs, grads = [], []
    for m in (ref, fp8):
        out = m(x.bfloat16(), t, context=cond["context"].bfloat16())
        out.float().square().mean().backward()
        outs.append(out.float())
        grads.append(m.blocks[0].mlp.fc1.weight.grad.float())
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    assert rel(outs[1], outs[0]) < 0.08, rel(outs[1], outs[0])  # e4m3: ~3 significant bits per element
    assert rel(grads[1], grads[0]) < 0.15, rel(grads[1], grads[0])
    assert rel(outs[1], outs[0]) > 0  # it did run in FP8


def test_bad_knobs_fail_up_front():
    with pytest.raises(ValueError, match="recipe"):
        check_float8("fp4")
    with pytest.raises(ValueError, match="modules"):
        check_float8("rowwise", "everything")
    with pytest.raises(NotImplementedError, match="tp=2"):
        check_float8("rowwise", "mlp", tp=2)
    check_float8(None, "whatever", tp=8)  # off: nothing to check
    with pytest.raises(ValueError, match="no linear"):
        apply_float8(nn.Sequential(nn.Linear(32, 32)), "rowwise", "mlp")


def _fsdp2_float8(rank, world):
    from torchao.float8.float8_linear import Float8Linear

    from bench import equivalence as E
    from nemo_vfm.models.dit.family import SPEC
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.mesh import build_mesh

    cfg = E.tiny_config()
    problem = E.make_problem(cfg, batch=2)
    batch = E._rows(problem, slice(None), torch.device("cpu"))  # every rank the whole batch: FSDP's mean = it

    def build():
        m = cfg.build("cpu")
        m.load_state_dict(problem["state"])
        return m

    ref = build()
    apply_float8(ref.blocks, "tensorwise", "all")
    ref_loss = E.forward_loss(ref, batch)
    ref_loss.backward()
    model = SPEC.parallelize(build(), build_mesh(ParallelDims(world_size=world), "cpu"), float8="tensorwise",
                            float8_modules="all", param_dtype=None, reduce_dtype=None)
    loss = E.forward_loss(model, batch)
    loss.backward()
    got, want = model.blocks[0].mlp.fc1.weight.grad.full_tensor(), ref.blocks[0].mlp.fc1.weight.grad
    return (float(loss), float(ref_loss), float((got - want).norm() / want.norm()),
            sum(isinstance(m, Float8Linear) for m in model.modules()))


def test_float8_under_fsdp2_equals_one_process_float8():
    from gloo_launcher import run_distributed

    for loss, ref_loss, grad_err, converted in run_distributed(_fsdp2_float8, 2):
        assert converted == 4 * 10  # 4 blocks x (q, k, v, proj of self- and cross-attention; fc1, fc2)
        assert abs(loss - ref_loss) <= 1e-6 * abs(ref_loss) and grad_err < 1e-5, (loss, ref_loss, grad_err)


def test_strategy_checks_float8_up_front():
    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    with pytest.raises(NotImplementedError, match="tensor parallelism"):
        VFMParallelStrategy(tensor_model_parallel_size=2, float8="rowwise")
    s = VFMParallelStrategy(float8="tensorwise", float8_modules="all")
    assert s.parallelize_kwargs["float8"] == "tensorwise"
