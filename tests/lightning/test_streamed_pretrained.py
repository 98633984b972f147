"""Pretrained Wan weights reach a parallelised network through train() + VFMParallelStrategy without a full
copy per rank: the network is built on the meta device, parallelised, materialised, and each rank reads only
the slices of the safetensors shards that it holds (2 gloo processes, FSDP2, TP2 and CP2 + FSDP2; full
fine-tuning with EMA, LoRA with EMA).

Checked per layout: after loading, a fixed forward equals the single-process model loaded plainly; every
element read from the files is one the rank holds (under FSDP2: half the model), and no tensor larger than
the largest local shard is touched while the strategy sets up; three training steps (losses, weights, EMA)
equal the materialise-then-shard path of the same layout; under TP2 and CP2 + FSDP2 (one data-parallel rank)
the losses also equal one process; LoRA keeps optimizer state for the adapters only."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "parallel"))

STEPS = 3


def _cfg(pretrained=None):
    from nemo_vfm.models.wan.model import WanConfig

    return WanConfig(num_layers=2, hidden_size=48, num_heads=4, ffn_size=64, in_channels=4, out_channels=4,
                     context_dim=16, freq_dim=16, text_len=4, pretrained=pretrained)


def _probe():
    g = torch.Generator().manual_seed(7)
    return (torch.randn(2, 4, 2, 4, 4, generator=g), torch.rand(2, generator=g), torch.randn(2, 3, 16, generator=g))


def _full(t):
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


class _MaxNumel(torch.utils._python_dispatch.TorchDispatchMode):
    """The largest tensor any op allocates (outputs that alias no input: views of memory-mapped safetensors
    files and in-place copies do not count, nor DTensor's fake tensors for sharding propagation); DTensor ops
    are counted through their local ops."""

    def __init__(self):
        super().__init__()
        self.max = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import FakeTensor
        from torch.distributed.tensor import DTensor
        from torch.utils._pytree import tree_leaves

        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        fresh = [r.alias_info is None for r in func._schema.returns]
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for t, new in zip(outs, fresh):
            for leaf in tree_leaves(t):
                if new and isinstance(leaf, torch.Tensor) and not (leaf.is_meta or isinstance(leaf, FakeTensor)):
                    self.max = max(self.max, leaf.numel())
        return out


def _strategy(stream: bool, **kw):
    from nemo_vfm.lightning.strategy import VFMParallelStrategy

    class Probe(VFMParallelStrategy):
        """Records what was allocated before sharding and the largest tensor touched while setting up."""

        def streams_weights(self, model_config) -> bool:
            return stream and super().streams_weights(model_config)

        def setup(self, trainer):
            module = self.lightning_module
            nets = [n for n in (module.model, module.ema) if n is not None]
            self.meta_before = all(p.is_meta for n in nets for p in n.parameters())
            with _MaxNumel() as mode:
                super().setup(trainer)
            self.max_numel = mode.max

    return Probe(param_dtype=None, **kw)


class _Record:
    """Counts the elements read from safetensors files (wraps ``safetensors.safe_open`` while active)."""

    def __init__(self):
        self.read = 0

    def __enter__(self):
        import safetensors

        self.orig, record = safetensors.safe_open, self

        class Slice:
            def __init__(self, s):
                self.s = s

            def get_shape(self):
                return self.s.get_shape()

            def __getitem__(self, idx):
                t = self.s[idx]
                record.read += t.numel()
                return t

        class Handle:
            def __init__(self, *a, **k):
                self.h = record.orig(*a, **k)

            def __enter__(self):
                self.h.__enter__()
                return self

            def __exit__(self, *exc):
                return self.h.__exit__(*exc)

            def keys(self):
                return self.h.keys()

            def get_slice(self, key):
                return Slice(self.h.get_slice(key))

            def get_tensor(self, key):
                t = self.h.get_tensor(key)
                record.read += t.numel()
                return t

        safetensors.safe_open = Handle
        return self

    def __exit__(self, *exc):
        import safetensors

        safetensors.safe_open = self.orig


def _callback():
    import lightning

    class Collect(lightning.Callback):
        def __init__(self):
            self.losses, self.out = [], {}

        def on_fit_start(self, trainer, module):
            from torch.distributed.tensor import DTensor

            from nemo_vfm.parallel.grads import clean_name

            s = trainer.strategy
            named = list(module.model.named_parameters())
            local = {n: p.to_local() if isinstance(p, DTensor) else p for n, p in named}
            x, t, ctx = _probe()
            with torch.no_grad():
                probe = module.model(x, t, ctx)
            state = {clean_name(k): _full(v) for k, v in module.model.state_dict().items()}
            self.out.update(meta_before=getattr(s, "meta_before", None), max_numel=getattr(s, "max_numel", None),
                            probe=probe, state=state,
                            local_base=sum(p.numel() for n, p in local.items() if ".lora_" not in n),
                            local_numel=sum(p.numel() for p in local.values()),
                            full_numel=sum(p.numel() for _, p in named),
                            max_local=max(p.numel() for p in local.values()), max_full=max(p.numel() for _, p in named))

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.losses.append(float(outputs["loss"]))

        def on_train_end(self, trainer, module):
            from torch.distributed.tensor import DTensor

            from nemo_vfm.parallel.grads import clean_name

            opt = trainer.optimizers[0]
            names = {id(p): clean_name(n) for n, p in module.model.named_parameters()}
            local = lambda t: t.to_local() if isinstance(t, DTensor) else t  # noqa: E731
            self.out.update(
                losses=self.losses,
                final={clean_name(k): _full(v) for k, v in module.model.state_dict().items()},
                ema={clean_name(k): _full(v) for k, v in module.ema.state_dict().items()} if module.ema else None,
                optim_params=sorted(names[id(p)] for p in opt.state),
                optim_numel=sum(local(v).numel() for st in opt.state.values() for k, v in st.items() if k != "step"),
                trainable_numel=sum(local(p).numel() for p in module.model.parameters() if p.requires_grad),
                trainable=sorted(clean_name(n) for n, p in module.model.named_parameters() if p.requires_grad))

    return Collect()


def _train(rank, world, root, folder, strategy_kw, lora, stream):
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.models.common.lora import LoRAConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    cb = _callback()
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16,
                                context_length=3, batch_size=2, num_samples=16)
    strategy = _strategy(stream, **strategy_kw) if strategy_kw is not None else "auto"
    trainer = TrainerConfig(max_steps=STEPS, devices=world, accelerator="cpu", precision="32-true", strategy=strategy,
                            log_every_n_steps=1, checkpoint_every_n_steps=100, enable_progress_bar=False,
                            gradient_clip_val=1.0, callbacks=[cb])
    name = f"{'stream' if stream else 'full'}-{sorted((strategy_kw or {}).items())}-{lora}"
    with _Record() as record:
        train(model=_cfg(folder), data=data, trainer=trainer, ema_decay=0.9, seed=3,
              lora=LoRAConfig(rank=4, alpha=8.0) if lora else None,
              log=ExperimentConfig(name=name, root=root, tensorboard=False))
    return {**cb.out, "read": record.read}


def _worker(rank, world, root, folder, cases):
    return {key: _train(rank, world, root, folder, kw, lora, stream) for key, (kw, lora, stream) in cases.items()}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from nemo_vfm.models.wan.convert import save_weights

    torch.manual_seed(0)
    net = _cfg().build()
    with torch.no_grad():  # away from the zero-initialised head, so that every weight matters
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("wan")
    save_weights(net.state_dict(), path, _cfg(), layout="diffusers", max_shard_bytes=20_000)
    return str(path)


def _close(a, b, tol=1e-5):
    return all((a[k] - b[k]).abs().max() <= tol * max(1.0, b[k].abs().max()) for k in b)


LAYOUTS = {"FSDP2": dict(fsdp=True), "TP2": dict(tensor_model_parallel_size=2, fsdp=False),
           "CP2+FSDP2": dict(context_parallel_size=2, context_parallel_kind="a2a", fsdp=True)}  # finetune_wan_14b's


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_streamed_pretrained_loading(tmp_path, folder, layout, lora):
    from gloo_launcher import run_distributed

    from nemo_vfm.models.wan.convert import load_pretrained

    plain = load_pretrained(folder, config=_cfg(folder))  # text_len is not in a diffusers config
    ref_probe = plain(*_probe()).detach()
    ref_state = plain.state_dict()
    kw = LAYOUTS[layout]
    cases = {"stream": (kw, lora, True), "full": (kw, lora, False)}
    ranks = run_distributed(_worker, 2, str(tmp_path), folder, cases)
    for i, rank in enumerate(ranks):
        s, f = rank["stream"], rank["full"]
        # streamed: nothing allocated before the plan was applied; otherwise rank 0 alone builds and loads the
        # network and sends each tensor once the others have laid theirs out on meta
        assert s["meta_before"] and f["meta_before"] == (i != 0)
        torch.testing.assert_close(s["probe"], ref_probe, rtol=1e-5, atol=1e-6)
        base = {k.replace(".base.", "."): v for k, v in s["state"].items() if ".lora_" not in k}
        assert _close(base, ref_state, 0)  # the loaded weights are the file's, exactly
        # each rank reads exactly what it holds, once (the EMA copies the model's shards); the other path: rank 0 all
        assert s["read"] == s["local_base"] and f["read"] == (0 if i else sum(v.numel() for v in ref_state.values()))
        if "FSDP2" in layout:  # FSDP2 shards over the data-parallel x CP ranks
            assert s["local_numel"] <= 0.55 * s["full_numel"]
            assert s["max_numel"] <= s["max_local"] < s["max_full"]  # no tensor larger than a local shard
        # the streamed run trains exactly as the materialise-then-shard run
        assert s["losses"] == pytest.approx(f["losses"], rel=1e-6, abs=1e-7)
        assert _close(s["final"], f["final"]) and _close(s["ema"], f["ema"])
        assert not _close(s["final"], s["state"], 0) and not _close(s["ema"], s["final"], 0)  # it did train
        if lora:
            assert s["optim_params"] == s["trainable"] and all(".lora_" in n for n in s["trainable"])
            assert len(s["trainable"]) == 2 * 2 * 10  # 2 blocks x 10 linears x (A, B)
            assert s["optim_numel"] == 2 * s["trainable_numel"]  # AdamW's two moments of this rank's adapter shards
    if layout != "FSDP2":  # one data-parallel rank: the same batches and noise as one process
        single = _train(0, 1, str(tmp_path / "single"), folder, None, lora, False)
        assert ranks[0]["stream"]["losses"] == pytest.approx(single["losses"], rel=1e-5)
        assert _close(ranks[0]["stream"]["final"], single["final"], 1e-4)
