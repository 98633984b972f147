"""FP8 LoRA bases (``frozen_dtype="fp8"``) get their weights on the two paths real Wan runs use: streamed from a
published folder (``model.pretrained`` under ``VFMParallelStrategy``: meta build, plan, ``to_empty``,
``init_weights()``; one process, and 2 gloo processes under FSDP2 and TP2) and ``init_from`` a plain checkpoint
(a single-device ``.ckpt`` file, and a sharded DCP folder on 2 gloo processes under FSDP2 and TP2; a safetensors
export through ``load_weights``). Each time every base equals ``quantize_rowwise`` of the source's float weight,
bit for bit, and the run trains 2 steps. What is still missing is named: a parameter of a kind the source never
holds (the loader's gap), or a config mismatch."""

import os
import sys

import pytest
import torch

from nemo_vfm.models.common.fp8_weights import FP8FrozenLinear, quantize_rowwise, quantized_bases

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parallel"))

STEPS = 2
LORA = dict(rank=4, alpha=8.0, frozen_dtype="fp8")


def _cfg(pretrained=None):
    from nemo_vfm.models.wan.model import WanConfig

    return WanConfig(num_layers=2, hidden_size=48, num_heads=4, ffn_size=64, in_channels=4, out_channels=4,
                     context_dim=16, freq_dim=16, text_len=4, pretrained=pretrained)


def _full(t):
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def _callback():
    import lightning

    class Collect(lightning.Callback):
        """The FP8 bases (full bits and scales) as the first step sees them, and the losses."""

        def __init__(self):
            self.bases, self.losses = {}, []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            from nemo_vfm.parallel.grads import clean_name

            if self.bases:
                return
            for n, m in module.model.named_modules():
                if isinstance(m, FP8FrozenLinear):
                    self.bases[clean_name(n)] = (_full(m.weight), _full(m.weight_scale))

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.losses.append(float(outputs["loss"]))

    return Collect()


def _train(root, name, world=1, strategy_kw=None, lora=True, pretrained=None, init_from=None):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.models.common.lora import LoRAConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    cb = _callback()
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16,
                                context_length=3, batch_size=2, num_samples=8)
    strategy = VFMParallelStrategy(param_dtype=None, **strategy_kw) if strategy_kw is not None else "auto"
    trainer = TrainerConfig(max_steps=STEPS, devices=world, accelerator="cpu", strategy=strategy,
                            log_every_n_steps=1, checkpoint_every_n_steps=100, enable_progress_bar=False,
                            callbacks=[cb])
    out = train(model=_cfg(pretrained), data=data, trainer=trainer, ema_decay=None, seed=3, init_from=init_from,
                lora=LoRAConfig(**LORA) if lora else None, log=ExperimentConfig(name=name, root=str(root),
                                                                                tensorboard=False))
    return {"bases": cb.bases, "losses": cb.losses, "checkpoint": str(out["checkpoint"])}


def _expected(float_state: dict) -> dict:
    """{LoRA base path: quantize_rowwise(its float weight)} of a plain network's weights."""
    return {f"{k.removesuffix('.weight')}.base": quantize_rowwise(v) for k, v in float_state.items()
            if k.endswith(".weight") and v.dim() == 2 and f"{k.removesuffix('.weight')}" in _LORA_PATHS}


_LORA_PATHS = {f"blocks.{i}.{m}" for i in range(2) for m in ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o",
                                                             "cross_attn.q", "cross_attn.k", "cross_attn.v",
                                                             "cross_attn.o", "ffn.0", "ffn.2")}


def _check(run, expected):
    assert set(run["bases"]) == set(expected) and len(expected) == 2 * 10
    for n, (bits, scale) in expected.items():
        got_bits, got_scale = run["bases"][n]
        assert got_bits.dtype == torch.uint8 and torch.equal(got_bits, bits), n
        assert torch.equal(got_scale, scale), n
    assert len(run["losses"]) == STEPS and all(torch.isfinite(torch.tensor(run["losses"])))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Wan folder (diffusers layout, several shards), perturbed so that every weight matters."""
    from nemo_vfm.models.wan.convert import load_pretrained, save_weights

    torch.manual_seed(0)
    net = _cfg().build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("wan")
    save_weights(net.state_dict(), path, _cfg(), layout="diffusers", max_shard_bytes=20_000)
    state = load_pretrained(str(path), config=_cfg(str(path))).state_dict()
    return str(path), _expected(state)


def test_streamed_pretrained_one_process(tmp_path, folder):
    path, expected = folder
    _check(_train(tmp_path, "stream", strategy_kw={}, pretrained=path), expected)


def test_meta_build_and_what_a_folder_lacks(folder):
    from nemo_vfm.models.common.lora import LoRAConfig, apply_lora
    from nemo_vfm.models.wan.weights import load_weights

    path, expected = folder
    net = _cfg().build("meta")  # unparallelised meta build: each tensor assigned as read, bases quantised
    apply_lora(net, LoRAConfig(**LORA))
    load_weights(net, path)
    bases = {n: m for n, m in net.named_modules() if isinstance(m, FP8FrozenLinear)}
    assert set(bases) == set(expected)
    for n, (bits, scale) in expected.items():
        assert torch.equal(bases[n].weight, bits) and torch.equal(bases[n].weight_scale, scale), n
    assert all(not p.is_meta for n, p in net.named_parameters() if ".lora_" not in n)
    keys = [k.replace(".base.", ".") for k in net.state_dict() if k.endswith(".base.weight")]
    assert set(quantized_bases(net, keys)) == set(keys) and len(keys) == 20
    with pytest.raises(ValueError, match=r"\['blocks.1.self_attn.v.weight'\] are not among the keys"):
        quantized_bases(net, [k for k in keys if k != "blocks.1.self_attn.v.weight"])

    extra = _cfg().build()  # a parameter of a kind no Wan folder holds: the loader's gap, not the config's
    extra.blocks[0].register_parameter("gain", torch.nn.Parameter(torch.ones(1)))
    with pytest.raises(KeyError, match=r"kind no Wan weights folder holds, e.g. \['blocks.0.gain'\]"):
        load_weights(extra, path)
    deeper = _cfg().build()
    deeper.blocks.append(_cfg().build().blocks[0])  # 3 blocks: the folder holds 2
    with pytest.raises(KeyError, match="lack 27 parameters .* the config"):
        load_weights(deeper, path)


def test_init_from_plain_checkpoint_file(tmp_path):
    from nemo_vfm.inference.checkpoint import (
        export_safetensors,
        load_weights,
        raw_state_dict,
        read_checkpoint_info,
    )
    from nemo_vfm.models.common.lora import LoRAConfig, apply_lora

    plain = _train(tmp_path, "plain", lora=False)  # a single-device run: one step=N.ckpt file
    info = read_checkpoint_info(plain["checkpoint"])
    expected = _expected(raw_state_dict(info))
    _check(_train(tmp_path, "lora", init_from=plain["checkpoint"]), expected)
    exported = export_safetensors(plain["checkpoint"], tmp_path / "plain.safetensors")  # the safetensors kind too
    net = _cfg().build()
    apply_lora(net, LoRAConfig(**LORA))
    load_weights(net, read_checkpoint_info(exported))
    bases = {n: m for n, m in net.named_modules() if isinstance(m, FP8FrozenLinear)}
    assert all(torch.equal(bases[n].weight, b) and torch.equal(bases[n].weight_scale, s)
               for n, (b, s) in expected.items()) and set(bases) == set(expected)

    extra = _cfg().build()
    extra.blocks[0].register_parameter("gain", torch.nn.Parameter(torch.ones(1)))
    apply_lora(extra, LoRAConfig(**LORA))
    with pytest.raises(ValueError, match=r"\['blocks.0.gain'\] are of a kind"):
        load_weights(extra, info)
    deeper = _cfg().build()
    deeper.blocks.append(_cfg().build().blocks[0])
    apply_lora(deeper, LoRAConfig(**LORA))
    with pytest.raises(ValueError, match="another model config"):
        load_weights(deeper, info)


def _worker(rank, world, root, path):
    out = {name: _train(root, f"stream-{name}", world, kw, pretrained=path)
           for name, kw in (("fsdp2", dict(fsdp=True)), ("tp2", dict(tensor_model_parallel_size=2, fsdp=False)))}
    plain = _train(root, "plain-dcp", world, dict(fsdp=True), lora=False)  # a sharded step=N.ckpt/ folder
    for name, kw in (("fsdp2", dict(fsdp=True)), ("tp2", dict(tensor_model_parallel_size=2, fsdp=False))):
        out[f"init_from_{name}"] = _train(root, f"lora-dcp-{name}", world, kw, init_from=plain["checkpoint"])
    out["plain_checkpoint"] = plain["checkpoint"]
    return out


def test_streamed_and_init_from_on_two_processes(tmp_path, folder):
    from gloo_launcher import run_distributed

    from nemo_vfm.inference.checkpoint import raw_state_dict, read_checkpoint_info

    path, expected = folder
    ranks = run_distributed(_worker, 2, str(tmp_path), path)
    info = read_checkpoint_info(ranks[0]["plain_checkpoint"])
    assert info.kind == "dcp"
    plain = _expected(raw_state_dict(info))
    for r in ranks:
        for name in ("fsdp2", "tp2"):
            _check(r[name], expected)
            _check(r[f"init_from_{name}"], plain)
