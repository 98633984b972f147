"""Block swapping (``nemo_vfm.parallel.block_swap``) on a tiny LoRA Wan, on CPU, where the "device copy" of a block's
frozen weights is a second host tensor: during a block's forward its frozen weights are a fresh copy, after it
they are the host tensors again; backward re-fetches them through the saved-tensor references; the loss and the
adapters' gradients are bitwise those of the plain path (also with activation checkpointing and activation
offloading); bad settings fail clearly; ``trainer.strategy.block_swap=2`` reaches the strategy from the CLI."""

import copy
import sys
from pathlib import Path

import pytest
import torch
from test_activation_offload import assert_same, batch, loss_and_grads, tiny_wan

from nemo_vfm.models.common.lora import LoRAConfig, apply_lora, init_lora_weights
from nemo_vfm.parallel.activation_checkpoint import apply_activation_checkpointing
from nemo_vfm.parallel.activation_offload import (
    ActivationOffloader,
    apply_saved_tensor_hooks,
    install_offload,
)
from nemo_vfm.parallel.block_swap import BlockSwapper, block_swapper, kept_on_host, unwrap


def lora_wan():
    net = tiny_wan()
    apply_lora(net, LoRAConfig(rank=4))
    init_lora_weights(net, 0)
    with torch.no_grad():  # B starts at zero: move it so that gradients reach every layer
        for n, p in net.named_parameters():
            if "lora_B" in n:
                p.add_(0.1 * torch.randn_like(p))
    return net


def swapped(net, n):
    swap = BlockSwapper(net.blocks, n, "cpu")
    install_offload(net, "cpu", swapper=swap)
    return swap


def test_frozen_weights_visit_the_device_per_block_and_results_are_bitwise_equal():
    net = lora_wan()
    ref = loss_and_grads(copy.deepcopy(net))
    host = {id(p): p.data_ptr() for b in net.blocks[:2] for p in b.parameters() if not p.requires_grad}
    swap = swapped(net, 2)
    assert len(swap.entries) == 2 and all(len(e) == len(host) // 2 for e in swap.entries)
    assert all(p.requires_grad for b in net.blocks[:2] for n, p in b.named_parameters() if "lora_" in n)
    seen = []  # registered after the swapper's hooks: sees the parameters as the block's forward does

    def check(mod, args):
        frozen = [p for p in mod.parameters() if not p.requires_grad]
        seen.append(all(p.data_ptr() != host[id(p)] for p in frozen))

    for b in net.blocks[:2]:
        b.register_forward_pre_hook(check)
    refs = []
    pack = swap.pack
    swap.pack = lambda t: (lambda r: (refs.append(r), r)[1])(pack(t))
    got = loss_and_grads(net)
    assert_same(ref, got)
    assert seen == [True, True]  # each block ran on a copy
    at_host = lambda b: all(p.data_ptr() == host[id(p)] for p in b.parameters() if not p.requires_grad)
    assert at_host(net.blocks[1]) and not at_host(net.blocks[0])  # the last block of backward stays on the device
    with torch.no_grad():
        net(*batch()[:2], context=batch()[2])  # ... until the next forward
    assert at_host(net.blocks[0]) and at_host(net.blocks[1]) and swap._cache.keys() <= {1}
    assert sum(r is not None for r in refs) >= 2 * 10  # per block: the frozen weights of its 10 adapted linears
    assert swap.fetches >= 4  # two blocks in forward, fetched again in backward
    assert not net.blocks[2]._forward_pre_hooks  # block 2 untouched


def test_a_blocks_copy_is_one_buffer_and_saved_views_find_their_weight():
    """Every weight of a block's copy is a view of one buffer (blocks of one shape reuse one allocation); a saved
    view of any of them (a transpose, as a linear's backward saves) maps back to that weight, and unpacks equal."""
    net = lora_wan()
    swap = swapped(net, 2)
    copies = swap._ready(1)
    assert len({c.untyped_storage().data_ptr() for c in copies}) == 1
    assert all(torch.equal(c, p.data) for c, p in zip(copies, swap.params(1)))
    for k in (0, len(copies) // 2, len(copies) - 1):
        view = copies[k].t() if copies[k].dim() == 2 else copies[k].reshape(-1)[1:]
        ref = swap.pack(view)
        assert (ref.block, ref.k) == (1, k)
        assert torch.equal(swap.unpack(ref), view)
    assert swap.pack(torch.zeros(3)) is None


def test_copies_run_one_block_ahead_in_the_direction_of_travel():
    net = lora_wan()
    swap = swapped(net, 3)
    order = []
    fetch = swap._fetch
    swap._fetch = lambda i: (order.append(i) if i not in swap._cache and 0 <= i < 3 else None, fetch(i))
    loss_and_grads(net)
    assert order == [0, 1, 2, 2, 1, 0]  # forward: 0, then 1 while 0 runs...; backward: 2, then 1 while 2's runs...
    assert swap._cache.keys() <= {0}  # at most the last block of backward stays until the next forward


@pytest.mark.parametrize("mode", ["full", "selective", "save_attention"])
def test_composes_with_activation_checkpointing_and_offloading(mode):
    net = lora_wan()
    ref = loss_and_grads(copy.deepcopy(net))
    apply_activation_checkpointing(net.blocks, mode, every=2)
    swap = BlockSwapper(net.blocks, 3, "cpu")
    host = {id(p): p.data_ptr() for i in range(3) for p in swap.params(i)}
    swap.install(net.blocks)
    off = ActivationOffloader("cpu", min_bytes=0)
    apply_saved_tensor_hooks(net.blocks, off, swap)
    on_copies = []  # each run of a block's own forward (checkpointing's recomputation included) sees device copies
    for b in net.blocks:
        unwrap(b).register_forward_pre_hook(lambda m, a: on_copies.append(
            all(p.data_ptr() != host[id(p)] for p in m.parameters() if not p.requires_grad)))
    assert_same(ref, loss_and_grads(net))
    checkpointed = sum(hasattr(b, "_checkpoint_wrapped_module") for b in net.blocks)
    assert all(on_copies) and len(on_copies) == 3 + checkpointed  # forward, then the recomputations
    assert off.packed > 0 and swap.fetches >= 6  # forward, then recomputation / references in backward


def test_kept_on_host_hides_the_swapped_weights_from_module_moves():
    net = lora_wan()
    swap = BlockSwapper(net.blocks, 1, "cpu")
    order = [n for n, _ in net.named_parameters()]
    with swap.kept_on_host():
        net.to(torch.float64)  # stands in for .to(device): a move that must skip the host-resident weights
    assert [n for n, _ in net.named_parameters()] == order  # order kept (EMA pairs parameters by position)
    for n, p in net.named_parameters():
        frozen_in_0 = n.startswith("blocks.0.") and not p.requires_grad
        assert p.dtype == (torch.float32 if frozen_in_0 else torch.float64), n


def test_ema_copy_swaps_what_is_frozen_in_the_model():
    net = lora_wan()
    ema = copy.deepcopy(net).requires_grad_(False)
    apply_activation_checkpointing(net.blocks, "full")  # the model is already wrapped when its EMA is handled

    def names(swap, blocks):
        paths = {id(m): n for n, m in unwrap(blocks[0]).named_modules()}
        return [(paths[id(mod)], name) for mod, name in swap.entries[0]]

    model_swap = BlockSwapper(net.blocks, 1, "cpu")
    ema_swap = block_swapper(ema, 1, "cpu", like=net)
    assert names(ema_swap, ema.blocks) == names(model_swap, net.blocks)
    got = names(ema_swap, ema.blocks)
    assert ("self_attn.q.base", "weight") in got and not any("lora_" in n for n, _ in got)


def test_bad_settings_fail_clearly():
    net = lora_wan()
    with pytest.raises(ValueError, match="block_swap=4 exceeds the 3 transformer blocks"):
        BlockSwapper(net.blocks, 4, "cpu")
    with pytest.raises(ValueError, match="block_swap must be an int >= 0"):
        BlockSwapper(net.blocks, -1, "cpu")
    with pytest.raises(ValueError, match="FSDP over several ranks"):
        block_swapper(net, 1, "cpu", fsdp=True)
    with pytest.raises(NotImplementedError, match="transformer blocks as `.blocks`"):
        block_swapper(torch.nn.Sequential(torch.nn.Linear(2, 2)), 1, "cpu")
    assert block_swapper(net, 0, "cpu") is None
    with pytest.warns(UserWarning, match="block_swap=1 has no effect: the first 1 blocks have no frozen weights"):
        BlockSwapper(tiny_wan().blocks, 1, "cpu")  # full fine-tuning: nothing is frozen
    from nemo_vfm.parallel.config import ParallelConfig

    for kw, match in [(dict(block_swap=1, tensor_model_parallel_size=2, sequence_parallel=False), "tensor parallel"),
                      (dict(block_swap=1, cpu_offload=True), "block_swap=0"),
                      (dict(block_swap=True), "int >= 0")]:
        with pytest.raises(ValueError, match=match):
            ParallelConfig(**kw)
    # the hooks are not traced by torch.compile: the blocks run eager (a warning when compile=True was asked for)
    assert ParallelConfig(block_swap=1).resolve_compile(cuda=True) is False
    assert ParallelConfig().resolve_compile(cuda=True) is True and ParallelConfig().resolve_compile(cuda=False) is False
    with pytest.warns(UserWarning, match="compile=True is ignored"):
        assert ParallelConfig(activation_offload=True, compile=True).resolve_compile(cuda=True) is False


def test_kept_on_host_restores_on_error():
    lin = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError), kept_on_host([(lin, "weight")]):
        assert "weight" not in lin._parameters
        raise RuntimeError
    assert list(lin._parameters) == ["weight", "bias"]


def test_cli_override_reaches_the_strategy(tmp_path, capsys):
    import fiddle as fdl

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "launchers"))
    import train as launcher

    out = tmp_path / "r.yaml"
    rc = launcher.main(["--factory", "lora_wan_1_3b", "--yes", "--dryrun", "trainer.strategy.block_swap=2",
                        "trainer.strategy.activation_offload=true", "--to-yaml", str(out)])
    assert rc == 0, capsys.readouterr().out[-2000:]
    text = out.read_text()
    assert "block_swap: 2" in text and "activation_offload: true" in text
    from nemo_vfm_recipes import finetune

    recipe = finetune.lora_wan_1_3b()
    recipe.trainer.strategy.block_swap = 2
    built = fdl.build(recipe.trainer.strategy)
    assert built.config.block_swap == 2 and "block_swap" not in built.parallelize_kwargs  # the strategy's own


def _train_runs(rank, world, root):
    """``train()`` with LoRA and an EMA copy, in one process: the plain run, the block-swapped (+ activation offload,
    a warned no-op on CPU) run and the ``cpu_offload`` run (FSDP2 in one process), each built as usual and streamed
    from a pretrained folder (meta build, the strategy materialises)."""
    import dataclasses
    import warnings

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.lightning.strategy import VFMParallelStrategy
    from nemo_vfm.models.wan.convert import save_weights
    from nemo_vfm.models.wan.model import WanConfig
    from nemo_vfm.parallel import block_swap
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    model = WanConfig(num_layers=3, hidden_size=32, num_heads=2, ffn_size=48, in_channels=4, out_channels=4,
                      context_dim=16, freq_dim=16, text_len=6)
    folder = f"{root}/wan"
    save_weights(tiny_wan().state_dict(), folder, model, layout="diffusers")
    fetched = []
    fetch = block_swap.BlockSwapper._fetch
    block_swap.BlockSwapper._fetch = lambda self, i: (fetched.append(i), fetch(self, i))[1]
    runs = {}
    for source in ("built", "streamed"):
        cfg = model if source == "built" else dataclasses.replace(model, pretrained=folder)
        for name, kw in (("plain", {}), ("swap", dict(block_swap=2, activation_offload=True)),
                         ("offload", dict(cpu_offload=True, param_dtype=None))):
            data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16,
                                        context_length=3, batch_size=2, num_samples=8)
            trainer = TrainerConfig(max_steps=2, devices=1, accelerator="cpu", precision="32-true",
                                    strategy=VFMParallelStrategy(**kw), log_every_n_steps=1,
                                    checkpoint_every_n_steps=2, enable_progress_bar=False)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = train(model=cfg, data=data, trainer=trainer, lora=LoRAConfig(rank=4), ema_decay=0.9, seed=0,
                            log=ExperimentConfig(name=f"{source}-{name}", root=root, tensorboard=False))
            runs[source, name] = (out["step"], out["loss"], any("no effect on a CPU" in str(w.message)
                                                                for w in caught), len(fetched))
            fetched.clear()
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from gloo_launcher import run_distributed

    return run_distributed(_train_runs, 1, str(tmp_path_factory.mktemp("runs")))[0]  # all in one spawned process


@pytest.mark.parametrize("source", ["built", "streamed"])
def test_train_with_block_swap_or_cpu_offload_matches_the_plain_run(runs, source):
    plain, swapped_run, offloaded = (runs[source, n] for n in ("plain", "swap", "offload"))
    assert offloaded[0] == 2 and offloaded[1] == pytest.approx(plain[1], rel=1e-5)  # the strategy path of FSDP2
    assert plain[:2] == swapped_run[:2] and plain[0] == 2  # same step, bitwise the same loss
    assert swapped_run[2] and not plain[2]
    assert plain[3] == 0 and swapped_run[3] >= 2 * 2 * 2  # 2 steps x 2 blocks x (forward, backward) at least
