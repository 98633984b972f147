"""FP8 storage of frozen LoRA base weights (``LoRAConfig.frozen_dtype="fp8"``): e4m3 with row-wise scales within
e4m3's rounding of the weights, every family's base linears converted, half the bytes of bf16 bases, merged
exports dequantised; a tiny Wan LoRA run through train() follows the frozen_dtype=None run's losses, resumes
from its checkpoint like the uninterrupted run, and exports the same adapter keys as a bf16 run, which diffusers
loads."""

import copy
import dataclasses

import pytest
import torch
from torch import nn

from bench.equivalence import tiny_config
from nemo_vfm.models.common.fp8_weights import (
    FP8FrozenLinear,
    dequantize,
    fill_quantized,
    frozen_weight_bytes,
    quantize_rowwise,
)
from nemo_vfm.models.common.lora import LoRAConfig, LoRALinear, apply_lora, merge_lora, merge_lora_state_dict


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_quantize_error_is_e4m3_rounding_per_row():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 256, generator=g) * torch.logspace(-3, 1, 32)[:, None]  # rows of very different scales
    w[3] = 0.0
    bits, scale = quantize_rowwise(w)
    assert bits.dtype == torch.uint8 and scale.dtype == torch.float32 and scale.shape == (32, 1)
    assert torch.equal(scale, scale.bfloat16().float())  # bf16-representable: FSDP2's bf16 all-gather is exact
    assert (w.abs().amax(1, keepdim=True) / scale <= 448).all()
    back = dequantize(bits, scale)
    # e4m3 keeps 3 mantissa bits: |error| <= 2^-4 |w| for normal values, <= 2^-10 * scale for subnormal ones
    bound = torch.maximum(w.abs() * 2**-4, scale * 2**-10)
    assert ((back - w).abs() <= bound * (1 + 1e-6)).all()
    assert torch.equal(back[3], torch.zeros(256))
    row_rel = (back - w).norm(dim=1) / w.norm(dim=1).clamp_min(1e-30)
    assert row_rel[w.norm(dim=1) > 0].max() < 0.04  # every row alike, whatever its magnitude
    with pytest.raises(ValueError, match="2-D float"):
        quantize_rowwise(torch.ones(4, dtype=torch.int32))


def test_fp8_linear_output_close_to_fp32_and_bf16():
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    fp8 = FP8FrozenLinear.from_linear(lin)
    x = torch.randn(5, 7, 64)
    ref = lin(x)
    out = fp8(x)  # no autocast: dequantised to the input's dtype (fp32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, nn.functional.linear(x, dequantize(fp8.weight, fp8.weight_scale), lin.bias))
    assert 0 < _rel(out, ref) < 0.04  # e4m3 rounding of the weights (bf16 storage: ~0.3%)
    with torch.autocast("cpu", torch.bfloat16):
        out16 = fp8(x)
        ref16 = copy.deepcopy(lin).to(torch.bfloat16)(x)
    assert out16.dtype == torch.bfloat16 and _rel(out16, ref) < 0.04 and _rel(ref16, ref) < 0.01
    assert not any(p.requires_grad for p in fp8.parameters())
    xg = x.clone().requires_grad_()
    fp8(xg).square().sum().backward()  # the input gradient flows through the dequantised weight
    assert xg.grad is not None and fp8.weight.grad is None
    with pytest.raises(NotImplementedError, match="set_weight"):
        fp8.reset_parameters()
    streamed = FP8FrozenLinear(64, 48)  # a loader's path: whole rows read, quantised as from_linear does
    assert fill_quantized(streamed, lambda region: lin.weight[region]) == 64 * 48
    assert torch.equal(streamed.weight, fp8.weight) and torch.equal(streamed.weight_scale, fp8.weight_scale)


def _family_config(family):
    from nemo_vfm.models.moviegen.flavors import moviegen_config
    from nemo_vfm.models.stdit.flavors import stdit_config
    from nemo_vfm.models.wan.flavors import wan_config

    if family == "dit":
        return tiny_config(num_layers=2)
    if family == "wan":
        return wan_config("tiny", text_len=8)
    return (stdit_config if family == "stdit" else moviegen_config)("tiny", in_channels=4, context_dim=32)


def _perturbed(cfg, seed=0):
    torch.manual_seed(seed)
    net = cfg.build()
    with torch.no_grad():  # away from zero-initialised heads/gates, so that every weight matters
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return net


@pytest.mark.parametrize("family", ["dit", "wan", "stdit", "moviegen"])
def test_every_family_fp8_bases_close_to_fp32(family):
    from nemo_vfm.models.families import family_spec

    cfg = _family_config(family)
    assert family_spec(cfg).name == family
    ref = _perturbed(cfg)
    net = _perturbed(cfg)
    names = apply_lora(net, LoRAConfig(rank=4, frozen_dtype="fp8"))
    bases = {n: m.base for n, m in net.named_modules() if isinstance(m, LoRALinear)}
    assert set(bases) == set(names) and all(type(b) is FP8FrozenLinear for b in bases.values())
    state = net.state_dict()
    for n in names:  # keys: the base weight keeps its name (uint8 e4m3 bits), its scale beside it
        assert state[f"{n}.base.weight"].dtype == torch.uint8 and state[f"{n}.base.weight_scale"].dtype == torch.float32
    others = {n: p.dtype for n, p in net.named_parameters() if not p.requires_grad and ".base.weight" not in n}
    assert set(others.values()) == {torch.bfloat16}  # every other frozen weight as frozen_dtype="bf16" keeps it
    assert {p.dtype for p in net.parameters() if p.requires_grad} == {torch.float32}  # the adapters

    x, t, cond = _inputs(cfg)
    with torch.no_grad():
        expect = ref(x, t, **cond)
        with torch.autocast("cpu", torch.bfloat16):
            got = net(x, t, **cond)
    assert 0 < _rel(got, expect) < 0.05, _rel(got, expect)  # measured 0.8-2.6% (bf16 storage: 0.6-0.7%)


def _inputs(cfg, seed=1):
    g = torch.Generator().manual_seed(seed)
    patch = getattr(cfg, "patch_size", (1, 2, 2))
    x = torch.randn(2, cfg.in_channels, 2 * patch[0], 4 * patch[1], 4 * patch[2], generator=g)
    cond = {"context": torch.randn(2, 5, cfg.context_dim, generator=g)} if getattr(cfg, "context_dim", None) else {}
    return x, torch.rand(2, generator=g), cond


def test_base_bytes_half_of_bf16():
    cfg = tiny_config(num_layers=2)
    nets = {}
    for fd in ("fp8", "bf16", None):
        nets[fd] = _perturbed(cfg)
        apply_lora(nets[fd], LoRAConfig(rank=4, frozen_dtype=fd))
    base_bytes = {fd: sum(frozen_weight_bytes(m.base) for m in n.modules() if isinstance(m, LoRALinear))
                  for fd, n in nets.items()}
    ratio = base_bytes["fp8"] / base_bytes["bf16"]
    assert 0.5 < ratio <= 0.5 + 4 / 64 + 0.01, ratio  # 1 byte a weight + one fp32 scale a row (in = 64 here)
    assert base_bytes["bf16"] * 2 == base_bytes[None]
    # the whole frozen network: its non-base weights stay bf16 (large in this tiny model: embedders, adaLN)
    assert frozen_weight_bytes(nets["fp8"]) < frozen_weight_bytes(nets["bf16"]) < frozen_weight_bytes(nets[None])


def test_merge_and_state_dict_loading():
    cfg = tiny_config(num_layers=2)
    net = _perturbed(cfg)
    float_state = {k: v.clone() for k, v in net.state_dict().items()}
    apply_lora(net, LoRAConfig(rank=4, alpha=8.0, frozen_dtype="fp8"))
    with torch.no_grad():
        for n, p in net.named_parameters():
            if ".lora_" in n:
                p.copy_(0.1 * torch.randn_like(p))
    x, t, cond = _inputs(cfg)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        out = net(x, t, **cond).float()
    state = {k: v.clone() for k, v in net.state_dict().items()}

    # a bf16 run's checkpoint (float base weights, no scales) loads into an fp8 network: quantised on the way in
    other = _perturbed(cfg, seed=5)
    apply_lora(other, LoRAConfig(rank=4, alpha=8.0, frozen_dtype="fp8"))
    bf16_like = {k: v for k, v in state.items() if not k.endswith("weight_scale")}
    for k in bf16_like:
        if k.endswith(".base.weight"):
            bf16_like[k] = float_state[k.replace(".base.", ".")].bfloat16()
    other.load_state_dict(bf16_like)
    for k, v in other.state_dict().items():
        if k.endswith(".base.weight"):
            e4m3 = lambda t: t.view(torch.float8_e4m3fn).float()  # noqa: E731
            assert (e4m3(v) - e4m3(state[k])).abs().max() <= 32  # bf16 input rounding: one e4m3 step at most
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        assert _rel(other(x, t, **cond), out) < 0.01

    with pytest.raises(NotImplementedError, match="merge_lora"):
        net.blocks[0].attn.q.merge()
    plain = cfg.build()  # merged export: dequantised bf16 base + adapter, the plain model's keys exactly
    merged = merge_lora_state_dict(state, 8.0 / 4)
    assert not any("weight_scale" in k for k in merged) and merged["blocks.0.attn.q.weight"].dtype == torch.bfloat16
    plain.load_state_dict(merged)
    merge_lora(net)
    assert not any(isinstance(m, (LoRALinear, FP8FrozenLinear)) for m in net.modules())
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        assert _rel(plain(x, t, **cond), out) < 0.01
        assert _rel(net(x, t, **cond), out) < 0.01


# -- train(): the CPU-sized Wan test -------------------------------------------------------------
LORA = dict(rank=4, alpha=4.0, targets=("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q",
                                        "cross_attn.k", "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2"))


@pytest.fixture(scope="module")
def wan_folder(tmp_path_factory):
    """A tiny Wan weights folder (diffusers layout), perturbed so that every frozen weight matters."""
    from nemo_vfm.models.wan.convert import save_weights
    from nemo_vfm.models.wan.flavors import wan_config

    cfg = wan_config("tiny", text_len=4)
    path = tmp_path_factory.mktemp("wan")
    save_weights(_perturbed(cfg).state_dict(), path, cfg)
    return dataclasses.replace(cfg, pretrained=str(path))


def _train(cfg, root, name, frozen_dtype, steps):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.inference.generate import SamplingConfig
    from nemo_vfm.lightning.callbacks import read_metrics
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.models.wan.flavors import wan_objective
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16, context_length=4,
                                batch_size=2, num_samples=16)
    out = train(model=cfg, data=data, objective=wan_objective("tiny"), ema_decay=None, seed=3,
                lora=LoRAConfig(**LORA, frozen_dtype=frozen_dtype), optim=OptimConfig(lr=1e-2, warmup_steps=1),
                trainer=TrainerConfig(max_steps=steps, accelerator="cpu", devices=1, enable_progress_bar=False,
                                      log_every_n_steps=1, checkpoint_every_n_steps=4),
                log=ExperimentConfig(name=name, root=str(root), tensorboard=False),
                sampling=SamplingConfig(enabled=False))
    losses = {r["step"]: r["loss"] for r in read_metrics(root / name / "metrics.jsonl")}
    return out, [losses[s] for s in sorted(losses)]


def test_wan_lora_trains_resumes_and_exports_like_bf16(wan_folder, tmp_path, capfd):
    from safetensors import safe_open

    from nemo_vfm.cli.main import main
    from nemo_vfm.inference.checkpoint import raw_state_dict, read_checkpoint_info

    _, ref = _train(wan_folder, tmp_path, "none", None, 8)  # fp32 (train() runs it 32-true on CPU)
    out, got = _train(wan_folder, tmp_path, "fp8", "fp8", 8)  # bf16 autocast, e4m3 bases
    assert len(got) == len(ref) == 8
    # within noise: measured at most 0.1% apart per step (bf16 bases: 0.03%); the batches differ by 10-30%
    for a, b in zip(got, ref):
        assert abs(a - b) <= 0.01 * b, (got, ref)
    assert sum(got[4:]) < sum(got[:4]) and sum(ref[4:]) < sum(ref[:4])  # both learn
    saved = raw_state_dict(read_checkpoint_info(out["checkpoint"]))
    assert saved["blocks.0.ffn.0.base.weight"].dtype == torch.uint8
    assert any(v.abs().sum() > 0 for k, v in saved.items() if ".lora_B." in k)

    # resume: 4 steps, then the same run continued to 8 from its step-4 checkpoint = the uninterrupted run
    _train(wan_folder, tmp_path, "fp8_resumed", "fp8", 4)
    capfd.readouterr()
    resumed, again = _train(wan_folder, tmp_path, "fp8_resumed", "fp8", 8)
    assert "resuming from" in capfd.readouterr().out and resumed["step"] == 8
    assert again == pytest.approx(got, rel=1e-5, abs=1e-6)
    final = raw_state_dict(read_checkpoint_info(resumed["checkpoint"]))
    for k, v in saved.items():
        assert torch.equal(final[k], v) if ".lora_" not in k else torch.allclose(final[k], v, rtol=1e-4, atol=1e-6), k

    # vfm export --format lora: the same keys and shapes as a bf16 run's export
    bf16, _ = _train(wan_folder, tmp_path, "bf16", "bf16", 1)
    files = {}
    for name in ("fp8", "bf16"):
        files[name] = tmp_path / f"{name}.safetensors"
        assert main(["export", "--ckpt", str(tmp_path / name), "--format", "lora", "--out", str(files[name])]) == 0
    shapes = {}
    for name, f in files.items():
        with safe_open(str(f), "pt") as h:
            shapes[name] = {k: (tuple(h.get_tensor(k).shape), h.get_tensor(k).dtype) for k in h.keys()}
    assert shapes["fp8"] == shapes["bf16"] and len(shapes["fp8"]) == 2 * 2 * len(LORA["targets"])
    _diffusers_loads(wan_folder, files["fp8"], saved)


def _diffusers_loads(cfg, lora_file, saved):
    """The exported adapters on diffusers' Wan transformer (fp32 base from the weights folder) give our fp8-base
    LoRA network's output within the fp8 tolerance."""
    pytest.importorskip("peft")
    from diffusers import WanTransformer3DModel

    ref = WanTransformer3DModel.from_pretrained(cfg.pretrained).eval()
    ref.load_lora_adapter(str(lora_file), prefix="transformer", adapter_name="ours")
    net = dataclasses.replace(cfg, pretrained=None).build()
    apply_lora(net, LoRAConfig(**LORA, frozen_dtype="fp8"))
    net.load_state_dict(saved)
    g = torch.Generator().manual_seed(1)
    x, t, ctx = torch.randn(2, 4, 2, 4, 4, generator=g), torch.rand(2, generator=g), torch.randn(2, 4, 16, generator=g)
    with torch.no_grad():
        theirs = ref(x, t * 1000, ctx, return_dict=False)[0]
        with torch.autocast("cpu", torch.bfloat16):
            ours = net.eval()(x, t, ctx).float()
    assert _rel(ours, theirs) < 0.05, _rel(ours, theirs)
