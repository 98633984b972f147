"""The shared published-weights loader (``nemo_vfm.models.common.published_weights``) with the Cosmos and HunyuanVideo
key maps: a tiny folder loads into an FP8 LoRA network (``frozen_dtype="fp8"``; meta build and materialised build),
every base equal to ``quantize_rowwise`` of the folder's float weight bit for bit (HunyuanVideo's converted weights,
the refiner's fused qkv and the final modulation, included), and the forward within FP8 tolerance of the bf16-base
network, also into FSDP2- and TP2-sharded networks on 2 gloo processes (each rank quantising whole rows of its shard);
an FP8 LoRA run streaming the folder (``VFMParallelStrategy``, one process) trains a step with a finite loss and
changes only the adapters; the loader's errors name the mismatch. (Wan: tests/models/test_fp8_frozen_loading.py.)
"""

import dataclasses
import os
import sys

import pytest
import torch

from nemo_vfm.models.common.fp8_weights import FP8FrozenLinear, quantize_rowwise
from nemo_vfm.models.common.lora import LoRAConfig, apply_lora, init_lora_weights
from nemo_vfm.models.common.published_weights import Source

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parallel"))


def _cosmos():
    from nemo_vfm.models.cosmos.flavors import cosmos_config

    return cosmos_config("tiny")


def _hunyuan():
    from nemo_vfm.models.hunyuan.flavors import hunyuan_config

    return hunyuan_config("tiny")


CASES = ["cosmos-diffusers", "cosmos-original", "hunyuan-diffusers", "hunyuan-original"]
# HunyuanVideo also adapts the layers whose weights the loader converts (fused qkv, reordered modulation halves)
EXTRA_TARGETS = {"cosmos": (), "hunyuan": ("self_attn_qkv", "final_layer.adaLN_modulation.1")}


def _weights(family):
    import importlib

    return importlib.import_module(f"nemo_vfm.models.{family}.weights")


def _lora(family, cfg, frozen_dtype):
    from nemo_vfm.models.common.lora import default_targets

    targets = default_targets(cfg.build("meta")) + EXTRA_TARGETS[family]
    return LoRAConfig(rank=4, alpha=8.0, targets=targets, frozen_dtype=frozen_dtype)


def _save(family, layout, cfg, state, path):
    """A tiny folder of ``state`` (our names) in ``layout``; Cosmos's original layout: the release's ``net.`` names."""
    if family == "cosmos" and layout == "original":
        from safetensors.torch import save_file

        from nemo_vfm.models.cosmos.convert import to_original

        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in to_original(state).items()}, str(path / "model.safetensors"))
        return path
    from importlib import import_module

    convert = import_module(f"nemo_vfm.models.{family}.convert")
    kw = {"max_shard_bytes": 40_000} if family == "cosmos" else {"layout": layout}  # Cosmos: several shards
    convert.save_weights(state, path, cfg, **kw)
    return path


@pytest.fixture(scope="module", params=CASES)
def case(request, tmp_path_factory):
    """(family, config naming the folder, the folder's float weights under our names)."""
    family, layout = request.param.split("-")
    cfg = _cosmos() if family == "cosmos" else _hunyuan()
    torch.manual_seed(0)
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    state = {k: v.detach().clone() for k, v in net.state_dict().items()}
    path = _save(family, layout, cfg, state, tmp_path_factory.mktemp(request.param))
    return family, dataclasses.replace(cfg, pretrained=str(path)), state


def _expected(net, state) -> dict:
    """{FP8 base path: quantize_rowwise(its float weight)}."""
    paths = [n.removesuffix(".base") for n, m in net.named_modules() if isinstance(m, FP8FrozenLinear)]
    return {p: quantize_rowwise(state[f"{p}.weight"]) for p in paths}


def _inputs(family, cfg):
    g = torch.Generator().manual_seed(1)
    channels = cfg.in_channels if family == "cosmos" else cfg.out_channels
    ctx_dim = cfg.context_dim if family == "cosmos" else cfg.text_dim
    return (
        torch.randn(2, channels, 2, 4, 4, generator=g),
        torch.rand(2, generator=g),
        torch.randn(2, 5, ctx_dim, generator=g),
    )


def test_fp8_folder_loads_quantised_and_close_to_bf16_base(case):
    family, cfg, state = case
    load = _weights(family).load_weights
    plain = dataclasses.replace(cfg, pretrained=None)
    nets = {}
    # meta: each tensor assigned as read; materialised: quantised into allocated bases (fill_quantized)
    for build in ("meta", "materialised"):
        net = plain.build("meta")
        apply_lora(net, _lora(family, cfg, "fp8"))
        if build == "materialised":
            net.to_empty(device="cpu")
        load(net, cfg.pretrained)
        expected = _expected(net, state)
        assert len(expected) >= 20 and all(
            torch.equal(m.weight, expected[n.removesuffix(".base")][0])
            and torch.equal(m.weight_scale, expected[n.removesuffix(".base")][1])
            for n, m in net.named_modules()
            if isinstance(m, FP8FrozenLinear)
        ), build
        assert all(not p.is_meta for n, p in net.named_parameters() if ".lora_" not in n), build
        if family == "hunyuan":
            assert {
                "txt_in.individual_token_refiner.blocks.0.self_attn_qkv",
                "final_layer.adaLN_modulation.1",
            } <= set(expected)
        nets[build] = net
    net = nets["materialised"]
    init_lora_weights(net, 0)  # lora_B = 0: the network is its base
    ref = plain.build()
    load(ref, cfg.pretrained)
    apply_lora(ref, _lora(family, cfg, "bf16"))
    init_lora_weights(ref, 0)
    x, t, ctx = _inputs(family, cfg)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        got, want = net.eval()(x, t, ctx).float(), ref.eval()(x, t, ctx).float()
    rel = ((got - want).norm() / want.norm()).item()
    assert 0 < rel < 0.05, rel  # measured 3.7% (Cosmos), 0.8% (HunyuanVideo): e4m3 rounding of the bases


def _collect():
    import lightning

    class Collect(lightning.Callback):
        """The network's parameters before the first step and after the last, and the losses."""

        def __init__(self):
            self.before, self.after, self.losses = None, None, []

        @staticmethod
        def _params(module):
            from nemo_vfm.parallel.grads import clean_name

            return {clean_name(n): p.detach().clone() for n, p in module.model.named_parameters()}

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if self.before is None:
                self.before = self._params(module)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.losses.append(float(outputs["loss"]))
            self.after = self._params(module)

    return Collect()


@pytest.mark.parametrize("family", ["cosmos", "hunyuan"])
def test_fp8_lora_run_streams_the_folder_and_trains_only_adapters(family, tmp_path, tmp_path_factory):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.diffusion.flow_matching import FlowMatching
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    cfg = _cosmos() if family == "cosmos" else _hunyuan()
    torch.manual_seed(0)
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in cfg.build().state_dict().items()}
    folder = _save(family, "diffusers", cfg, state, tmp_path / "weights")
    cfg = dataclasses.replace(cfg, pretrained=str(folder))
    ctx_dim = cfg.context_dim if family == "cosmos" else cfg.text_dim
    data = MockLatentDataModule(
        latent_channels=4,
        num_frames=2,
        height=4,
        width=4,
        context_dim=ctx_dim,
        context_length=3,
        batch_size=2,
        num_samples=4,
    )
    cb = _collect()
    trainer = TrainerConfig(
        max_steps=1,
        devices=1,
        accelerator="cpu",
        strategy=VFMParallelStrategy(param_dtype=None),
        log_every_n_steps=1,
        checkpoint_every_n_steps=100,
        enable_progress_bar=False,
        callbacks=[cb],
    )
    train(
        model=cfg,
        data=data,
        trainer=trainer,
        objective=FlowMatching(),
        ema_decay=None,
        seed=3,
        lora=_lora(family, cfg, "fp8"),
        log=ExperimentConfig(name="fp8", root=str(tmp_path), tensorboard=False),
    )
    assert len(cb.losses) == 1 and torch.isfinite(torch.tensor(cb.losses)).all()
    bases = {n.removesuffix(".base.weight"): p for n, p in cb.before.items() if n.endswith(".base.weight")}
    assert len(bases) >= 20 and all(p.dtype == torch.uint8 for p in bases.values())
    for n, p in bases.items():  # streamed and quantised as read: the folder's weights
        bits, scale = quantize_rowwise(state[f"{n}.weight"])
        assert torch.equal(p, bits) and torch.equal(cb.before[f"{n}.base.weight_scale"], scale), n
    changed = {n for n in cb.before if not torch.equal(cb.before[n], cb.after[n])}
    assert changed and all(".lora_" in n for n in changed), sorted(changed)[:5]
    assert any(".lora_B." in n for n in changed)


def _sharded_worker(rank, world, folders):
    """{(family, layout): {base path: (full bits, full scales)}} of FP8 LoRA networks built on meta, sharded,
    materialised and filled from the folder."""
    from torch.distributed.tensor import DTensor

    from nemo_vfm.models.families import family_spec
    from nemo_vfm.parallel.dims import ParallelDims
    from nemo_vfm.parallel.grads import clean_name
    from nemo_vfm.parallel.mesh import build_mesh

    full = lambda t: (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()  # noqa: E731
    out = {}
    for family, folder in folders.items():
        cfg = _cosmos() if family == "cosmos" else _hunyuan()
        for layout, kw in {"fsdp2": {}, "tp2": dict(tp=2)}.items():
            net = cfg.build("meta")
            apply_lora(net, _lora(family, cfg, "fp8"))
            pmesh = build_mesh(ParallelDims(world_size=world, **kw))
            family_spec(cfg).parallelize(net, pmesh, param_dtype=None, reduce_dtype=None)
            net.to_empty(device="cpu")
            _weights(family).load_weights(net, folder)
            bases = {
                clean_name(n).removesuffix(".base"): m
                for n, m in net.named_modules()
                if isinstance(m, FP8FrozenLinear)
            }
            assert any(isinstance(m.weight, DTensor) for m in bases.values())
            out[family, layout] = {n: (full(m.weight), full(m.weight_scale)) for n, m in bases.items()}
    return out


def test_fp8_folders_stream_into_fsdp2_and_tp2_shards(tmp_path):
    from gloo_launcher import run_distributed

    states, folders = {}, {}
    for family in ("cosmos", "hunyuan"):
        cfg = _cosmos() if family == "cosmos" else _hunyuan()
        torch.manual_seed(1)
        states[family] = {k: v + 0.05 * torch.randn_like(v) for k, v in cfg.build().state_dict().items()}
        folders[family] = str(_save(family, "diffusers", cfg, states[family], tmp_path / family))
    ranks = run_distributed(_sharded_worker, 2, folders)
    for got in ranks:
        assert len(got) == 4
        for (family, layout), bases in got.items():
            assert len(bases) >= 20, (family, layout)
            for n, (bits, scale) in bases.items():
                want_bits, want_scale = quantize_rowwise(states[family][f"{n}.weight"])
                assert torch.equal(bits, want_bits) and torch.equal(scale, want_scale), (family, layout, n)


# -- errors ---------------------------------------------------------------------------------------------------
def test_mismatched_folders_raise_naming_the_problem(case):
    family, cfg, _ = case
    load = _weights(family).load_weights
    label = {"cosmos": "Cosmos", "hunyuan": "HunyuanVideo"}[family]
    fewer = dataclasses.replace(cfg, pretrained=None, num_layers=1).build()
    with pytest.raises(KeyError, match=f"that this {label} model lacks: the weights do not match the config"):
        load(fewer, cfg.pretrained)
    assert load(fewer, cfg.pretrained, strict=False) > 0  # strict=False: the extra layer's keys skipped
    more = dataclasses.replace(cfg, pretrained=None, num_layers=3).build()
    with pytest.raises(KeyError, match=rf"lack \d+ parameters of this {label} model, e.g. .*the config"):
        load(more, cfg.pretrained)
    gained = dataclasses.replace(cfg, pretrained=None).build()
    gained.final_layer.register_parameter("gain", torch.nn.Parameter(torch.ones(1)))
    with pytest.raises(KeyError, match=rf"kind no {label} weights folder holds, e.g. \['final_layer.gain'\]"):
        load(gained, cfg.pretrained)
    wider = dataclasses.replace(
        cfg, pretrained=None, hidden_size=2 * cfg.hidden_size, num_heads=2 * cfg.num_heads
    )
    with pytest.raises(ValueError, match="in the weights, .* in the model; the config does not match"):
        load(wider.build("meta"), cfg.pretrained)


def test_source_and_folder_errors(tmp_path):
    from nemo_vfm.models.common.published_weights import safetensors_files

    with pytest.raises(ValueError, match="one file key, or several with a convert function"):
        Source(("a", "b"))
    with pytest.raises(FileNotFoundError, match="no safetensors weights in .*; point at a Cosmos folder"):
        safetensors_files(tmp_path, "a Cosmos folder")
