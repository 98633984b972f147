"""Sparse self-attention as a model setting (``attention="sta"|"vsa"``) in Wan and the DiT: a window covering the
grid equals dense attention, a real window / VSA equal the same network whose self-attention runs the reference
``masked_dense_attention`` under the pattern of the grid (forward, and gradients of every parameter), dense stays
the default with unchanged state dicts, VSA's gates start at zero (also when loading a published Wan folder)."""

import copy

import pytest
import torch

from nemo_vfm.models.common.attention import SDPACore, SparseAttentionCore, sparse_settings
from nemo_vfm.models.common.embeddings import apply_rope, apply_rope_interleaved
from nemo_vfm.models.dit.model import DiTConfig
from nemo_vfm.models.wan.model import WanConfig, _heads
from nemo_vfm.parallel.sparse_attention import SparsePattern, masked_dense_attention, vsa_topk

LATENT = (4, 8, 8)  # patch (1, 2, 2) -> a 4 x 4 x 4 grid, 64 tokens; tile (1, 2, 2) -> 4 x 2 x 2 tiles
GRID, TILE = (4, 4, 4), (1, 2, 2)
WAN = dict(
    num_layers=2,
    hidden_size=32,
    num_heads=2,
    ffn_size=48,
    in_channels=4,
    out_channels=4,
    context_dim=16,
    freq_dim=16,
    text_len=8,
)
DIT = dict(num_layers=2, hidden_size=32, num_heads=2, in_channels=4, context_dim=16, adaln_lora_rank=4)
FAMILIES = {"wan": (WanConfig, WAN, "self_attn"), "dit": (DiTConfig, DIT, "attn")}


def _config(family, **kw):
    cls, base, _ = FAMILIES[family]
    return cls(**base, **kw)


def _perturbed(cfg, seed=0):
    """The network with every parameter moved off its init (adaLN-Zero and zero output layers would hide
    differences), including VSA's zero-initialised gates."""
    torch.manual_seed(seed)
    model = cfg.build()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def _inputs(seed=1, latent=LATENT):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, 4, *latent, generator=g),
        torch.rand(2, generator=g),
        {"context": torch.randn(2, 5, 16, generator=g), "context_mask": torch.ones(2, 5, dtype=torch.bool)},
    )


def _run(model, grad=True):
    """Output and the gradients of every parameter of one forward/backward on fixed inputs."""
    x, t, cond = _inputs()
    model.zero_grad()
    if not grad:
        with torch.no_grad():
            return model(x, t, **cond), {}
    out = model(x, t, **cond)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _close(a, b, tol=1e-5):
    return (a - b).abs().max() <= tol * b.abs().max().clamp_min(1e-12)


def _assert_same(got, ref, tol=1e-5):
    (out, grads), (ref_out, ref_grads) = got, ref
    assert _close(out, ref_out, tol), (out - ref_out).abs().max()
    assert grads.keys() == ref_grads.keys()
    bad = [n for n in ref_grads if not _close(grads[n], ref_grads[n], tol)]
    assert not bad, bad


def _reference(model, family, pattern):
    """A copy of ``model`` whose self-attention modules compute the pattern with ``masked_dense_attention`` from
    their own weights (written here from the attention math, independent of the sparse core)."""
    ref = copy.deepcopy(model)
    name = FAMILIES[family][2]
    for block in ref.blocks:
        attn = getattr(block, name)

        def forward(x, rope=None, mask=None, a=attn):
            if family == "wan":
                q, k = _heads(a.norm_q(a.q(x)), a.head_dim), _heads(a.norm_k(a.k(x)), a.head_dim)
                v, rot, out_proj = _heads(a.v(x), a.head_dim), apply_rope_interleaved, a.o
            else:
                q, k = a.q_norm(_heads(a.q(x), a.head_dim)), a.k_norm(_heads(a.k(x), a.head_dim))
                v, rot, out_proj = _heads(a.v(x), a.head_dim), apply_rope, a.proj
            if rope is not None:
                q, k = rot(q, *rope), rot(k, *rope)
            gate = None if a.gate_compress is None else _heads(a.gate_compress(x), a.head_dim)
            out = masked_dense_attention(q, k, v, pattern, gate=gate)
            return out_proj(out.transpose(1, 2).flatten(2))

        attn.forward = forward
    return ref


@pytest.mark.parametrize("family", FAMILIES)
def test_sta_with_a_window_over_the_whole_grid_equals_dense(family):
    dense = _perturbed(_config(family))
    sta = _config(family, attention="sta", attention_tile=TILE, attention_window=(5, 3, 3)).build()
    assert sta.state_dict().keys() == dense.state_dict().keys()
    sta.load_state_dict(dense.state_dict())
    _assert_same(_run(sta), _run(dense))  # training: masked dense path on the CPU
    assert _close(_run(sta, grad=False)[0], _run(dense, grad=False)[0])  # sampling: eager FlexAttention


@pytest.mark.parametrize("family", FAMILIES)
def test_sta_window_equals_masked_dense_reference(family):
    window = (3, 1, 1)  # 3 of 4 tile frames (shifted inside the grid at its ends), the query tile's own h, w
    model = _perturbed(_config(family, attention="sta", attention_tile=TILE, attention_window=window))
    ref = _reference(model, family, SparsePattern(kind="sta", grid_thw=GRID, tile=TILE, window=window))
    got = _run(model)
    _assert_same(got, _run(ref))
    dense = _config(family).build()
    dense.load_state_dict(model.state_dict())
    assert not _close(got[0], _run(dense)[0], 1e-3)  # the window matters
    assert _close(_run(model, grad=False)[0], _run(ref, grad=False)[0])


@pytest.mark.parametrize("family", FAMILIES)
def test_vsa_equals_masked_dense_reference_and_its_gate_starts_at_zero(family):
    cfg = _config(family, attention="vsa", attention_tile=TILE, attention_sparsity=0.5)
    pattern = SparsePattern(kind="vsa", grid_thw=GRID, tile=TILE, topk=vsa_topk(0.5, 16))
    name = FAMILIES[family][2]
    fresh = cfg.build()
    gates = [getattr(b, name).gate_compress for b in fresh.blocks]
    assert all(g is not None and not g.weight.any() and not g.bias.any() for g in gates)
    model = _perturbed(cfg)  # gates no longer zero: fine + gate * coarse
    got = _run(model)
    _assert_same(got, _run(_reference(model, family, pattern)))
    assert all(got[1][f"blocks.{i}.{name}.gate_compress.weight"].abs().max() > 0 for i in range(2))


@pytest.mark.parametrize("kind", ["sta", "vsa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_dense_blocks_keep_dense_attention_and_the_rest_the_pattern(family, kind):
    """``attention_dense_blocks=[1]``: block 1 runs dense SDPA (no VSA gate), block 0 the pattern; the network
    equals the reference with the pattern in block 0 only (forward and every gradient)."""
    knobs = {"attention_window": (3, 1, 1)} if kind == "sta" else {"attention_sparsity": 0.5}
    cfg = _config(family, attention=kind, attention_tile=TILE, attention_dense_blocks=[1], **knobs)
    assert cfg.attention_dense_blocks == (1,)
    name = FAMILIES[family][2]
    model = _perturbed(cfg)
    attns = [getattr(b, name) for b in model.blocks]
    assert [type(a.core) for a in attns] == [SparseAttentionCore, SDPACore] and attns[1].gate_compress is None
    pattern = (SparsePattern(kind="sta", grid_thw=GRID, tile=TILE, window=(3, 1, 1)) if kind == "sta" else
               SparsePattern(kind="vsa", grid_thw=GRID, tile=TILE, topk=vsa_topk(0.5, 16)))
    ref = _reference(model, family, pattern)
    del getattr(ref.blocks[1], name).forward  # block 1 of the reference: the module's own (dense) forward
    got = _run(model)
    _assert_same(got, _run(ref))
    all_sparse = _config(family, attention=kind, attention_tile=TILE, **knobs).build()
    all_sparse.load_state_dict(model.state_dict(), strict=False)  # VSA: block 1's gate stays at zero
    assert not _close(got[0], _run(all_sparse)[0], 1e-3)  # the dense block matters


def test_dense_is_the_default_and_state_dicts_are_unchanged():
    for cls, base, name in FAMILIES.values():
        dense = cls(**base).build()
        assert cls(**base).attention == "dense" and sparse_settings(cls(**base)) is None
        assert all(
            isinstance(getattr(b, name).core, SDPACore) and getattr(b, name).gate_compress is None
            for b in dense.blocks
        )
        keys = list(dense.state_dict())
        assert list(cls(**base, attention="sta").build().state_dict()) == keys
        vsa = set(cls(**base, attention="vsa").build().state_dict())
        assert vsa - set(keys) == {
            f"blocks.{i}.{name}.gate_compress.{p}" for i in range(2) for p in ("weight", "bias")
        }
    # a config pickled before these fields existed reads the class defaults: dense
    old = WanConfig(**WAN)
    for f in ("attention", "attention_tile", "attention_window", "attention_sparsity", "attention_dense_blocks"):
        del old.__dict__[f]
    assert old.attention == "dense" and sparse_settings(old) is None


def test_config_errors_and_warnings():
    with pytest.raises(ValueError, match=r"WanConfig.attention must be one of \('dense', 'sta', 'vsa'\)"):
        WanConfig(**WAN, attention="flex")
    with pytest.raises(ValueError, match=r"DiTConfig.attention_window must be odd.*\(3, 3, 5\)"):
        DiTConfig(**DIT, attention="sta", attention_window=(3, 3, 4))
    with pytest.raises(ValueError, match="DiTConfig.attention_tile must be three positive integers"):
        DiTConfig(**DIT, attention="sta", attention_tile=(4, 8))
    with pytest.raises(ValueError, match=r"WanConfig.attention_sparsity must be a number in \[0, 1\)"):
        WanConfig(**WAN, attention="vsa", attention_sparsity=1.0)
    with pytest.warns(UserWarning, match="attention_window has no effect with attention='vsa'"):
        WanConfig(**WAN, attention="vsa", attention_window=(1, 1, 1))
    with pytest.raises(ValueError, match=r"DiTConfig.attention_dense_blocks must be block indices in \[0, "
                                         r"num_layers=2\)"):
        DiTConfig(**DIT, attention="sta", attention_dense_blocks=[2])
    with pytest.raises(ValueError, match="attention_dense_blocks names every block"):
        WanConfig(**WAN, attention="sta", attention_dense_blocks=[0, 1])
    with pytest.warns(UserWarning, match="attention_dense_blocks has no effect with attention='dense'"):
        WanConfig(**WAN, attention_dense_blocks=[0])
    cfg = WanConfig(**WAN, attention="sta", attention_tile=[1, 2, 2], attention_window=[3, 1, 1])
    assert cfg.attention_tile == (1, 2, 2) and cfg.attention_window == (3, 1, 1)  # lists from YAML -> tuples


def test_unsupported_inputs_raise_clear_errors():
    dit = _config("dit", attention="sta", attention_tile=TILE)
    with pytest.raises(NotImplementedError, match="on packed batches is not implemented"):
        dit.build().forward_tokens_packed(None, None, None, None, None, None, None, None)
    core = SparseAttentionCore(sparse_settings(dit))
    q = torch.randn(1, 2, 64, 8)
    with pytest.raises(RuntimeError, match="needs the latent grid.*dit and wan families"):
        core(q, q, q)
    core.grid = GRID
    with pytest.raises(ValueError, match="needs its 64 tokens on this rank, got 32 queries"):
        core(q[:, :, :32], q[:, :, :32], q[:, :, :32])
    with pytest.raises(NotImplementedError, match="takes no attention mask"):
        core(q, q, q, torch.ones(64, 64, dtype=torch.bool))
    out = core(
        torch.cat([q, q[:, :, :3]], 2), q, q
    )  # trailing CP padding: the pattern on the first 64 tokens
    assert out.shape == (1, 2, 67, 8) and not out[:, :, 64:].any()
    assert torch.allclose(out[:, :, :64], core(q, q, q), atol=1e-6)


def test_vsa_gates_start_at_zero_when_loading_a_published_wan_folder(tmp_path):
    pytest.importorskip("diffusers")
    from nemo_vfm.models.wan.convert import save_weights

    dense = _perturbed(WanConfig(**WAN))
    save_weights(dense.state_dict(), tmp_path, WanConfig(**WAN), layout="diffusers")
    cfg = WanConfig(**WAN, attention="vsa", pretrained=str(tmp_path))
    meta = cfg.build("meta").to_empty(device="cpu")
    meta.init_weights()  # the strategy's path: materialise, then init_weights() reads the folder
    for model in (cfg.build(), meta):
        state = model.state_dict()
        for k, v in dense.state_dict().items():
            assert torch.equal(state[k], v), k
        gates = [k for k in state if "gate_compress" in k]
        assert len(gates) == 4 and not any(state[k].any() for k in gates)


def test_recipes_turn_sparse_attention_on_and_train(tmp_path):
    """``with_sparse_attention`` on the registered sparse factories, refused where it cannot apply; the Wan one
    trains with its STA setting kept (tests/test_recipes_resume.py rebuilds Wan configs from a folder, i.e. dense)."""
    import importlib.util
    import sys
    from pathlib import Path

    import fiddle as fdl

    pytest.importorskip("diffusers")
    from nemo_vfm_recipes import dit, finetune, stdit

    root = Path(__file__).resolve().parents[2]
    recipe = finetune.lora_wan_1_3b_sparse()
    assert (recipe.model.attention, recipe.model.attention_tile, recipe.model.attention_window) == (
        "sta",
        (4, 8, 4),
        (3, 3, 3),
    )
    assert recipe.trainer.strategy.context_parallel_kind == "a2a" and recipe.lora is not None
    assert recipe.model.attention_dense_blocks == ()
    for r in (dit.pretrain_xl_sparse(), dit.pretrain_7b_sparse()):  # from scratch: first and middle blocks dense
        built = fdl.build(r.model)
        assert built.attention == "sta" and built.attention_dense_blocks == (0, 14) and built.num_layers == 28
    with pytest.raises(NotImplementedError, match="DiT and Wan families"):
        finetune.with_sparse_attention(stdit.pretrain_stdit_xl())
    with pytest.raises(ValueError, match="LoRA would keep frozen at zero"):
        finetune.with_sparse_attention(finetune.lora_wan_1_3b(), "vsa")
    # the Wan recipe at CPU size (tests/test_recipes_resume.py's shrink), its attention settings put back
    sys.path.insert(0, str(root / "tests"))
    spec = importlib.util.spec_from_file_location("_resume", root / "tests" / "test_recipes_resume.py")
    resume = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(resume)
    from nemo_vfm.models.wan import convert

    folder = tmp_path / "wan"
    cfg = WanConfig(**WAN)
    convert.save_weights(cfg.build().state_dict(), folder, cfg, layout="diffusers")
    small = resume._shrink("lora_wan_1_3b_sparse", tmp_path, folder)
    small.model.attention, small.model.attention_tile, small.model.attention_window = (
        "sta",
        (1, 1, 1),
        (1, 1, 1),
    )
    small.trainer.max_steps, small.trainer.strategy.compile = (
        1,
        False,
    )  # eager: compiling takes ~40 s on a CPU
    out = fdl.build(small)()
    assert out["step"] == 1


def test_sta_core_takes_the_in_graph_path_with_a_prebuilt_mask(monkeypatch):
    """On CUDA the model hands each STA core its grid and block mask before the blocks run, and the core calls
    FlexAttention with that mask where a compiled block traces it (no graph break). Off CUDA no mask is built;
    here the CUDA branch runs on the CPU with eager FlexAttention (forward only) and equals masked dense."""
    from nemo_vfm.models.common.attention import SparseSettings
    from nemo_vfm.parallel.sparse_attention import sta_block_mask

    grid, tile, window = (4, 8, 16), (2, 8, 8), (1, 1, 1)  # 2 x 1 x 2 tiles of 128 tokens
    core = SparseAttentionCore(SparseSettings(kind="sta", tile=tile, window=window, sparsity=0.9))
    core.set_grid(grid, torch.device("cpu"))
    assert core.grid == grid and core._sta is None
    pattern = SparsePattern(kind="sta", grid_thw=grid, tile=tile, window=window)
    core._sta = (pattern.layout, sta_block_mask(pattern, "cpu"))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # as inside a compiled block
    calls = []
    monkeypatch.setattr(core, "_forward_outside_graph", lambda *a: calls.append(a))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 512, 16, generator=g) for _ in range(3))
    with torch.no_grad():
        _close(core(q, k, v), masked_dense_attention(q, k, v, pattern), tol=1e-5)
        core(q, k, v, torch.ones(1, 1, 1, 512, dtype=torch.bool))  # a mask (CP padding) leaves the graph
    assert len(calls) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["sta", "vsa"])
@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_compiled_blocks_equal_the_reference(family, kind):
    """On CUDA: 128-token tiles through compiled FlexAttention inside compiled blocks (as the GPU recipes run),
    forward and gradients against the masked dense reference (fp32)."""
    from nemo_vfm.parallel.compile import compile_blocks

    tile, grid = (4, 8, 4), (8, 24, 12)  # 2 x 3 x 3 tiles of 128 tokens, 2,304 tokens
    window, sparsity = (1, 3, 1), 0.5
    cfg = _config(
        family, attention=kind, attention_tile=tile, attention_window=window, attention_sparsity=sparsity
    )
    model = _perturbed(cfg).cuda()
    pattern = (
        SparsePattern(kind="sta", grid_thw=grid, tile=tile, window=window)
        if kind == "sta"
        else SparsePattern(kind="vsa", grid_thw=grid, tile=tile, topk=vsa_topk(sparsity, 18))
    )
    ref = _reference(model, family, pattern)
    compile_blocks(model.blocks)
    x, t, cond = _inputs(latent=(8, 48, 24))
    x, t, cond = x.cuda(), t.cuda(), {k: v.cuda() for k, v in cond.items()}
    results = []
    for m in (model, ref):
        m.zero_grad()
        out = m(x, t, **cond)
        (out * torch.linspace(-1, 1, out.numel(), device="cuda").view_as(out)).sum().backward()
        results.append((out.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    _assert_same(results[0], results[1], tol=2e-3)
