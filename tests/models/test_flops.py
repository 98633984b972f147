"""The analytic FLOP counters: hand counts, and for every family the exact FLOPs that
``torch.utils.flop_counter.FlopCounterMode`` measures on a real forward of the network.

FlopCounterMode counts matmuls, convolutions and attention, and nothing else (no norms, softmax, activations,
RoPE, modulation or bias arithmetic): exactly what the counters count, so the comparison is exact. Attention
runs through SDPA's math backend here, which FlopCounterMode sees as ``bmm`` (the CPU flash kernel has no
formula), so ``bmm``/``baddbmm`` is the attention and everything else the linear part.
"""

import json
from types import SimpleNamespace

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from nemo_vfm.models.common.moe import MoEConfig
from nemo_vfm.models.cosmos.flavors import cosmos_config
from nemo_vfm.models.dit.flavors import dit_config, original_dit_config
from nemo_vfm.models.families import _table, family_spec
from nemo_vfm.models.flops import dit_forward_flops, mfu, peak_tflops, train_step_flops
from nemo_vfm.models.hunyuan.flavors import hunyuan_config
from nemo_vfm.models.kandinsky6.flavors import kandinsky6_config
from nemo_vfm.models.ltx2.flavors import ltx2_config
from nemo_vfm.models.moviegen.flavors import moviegen_config
from nemo_vfm.models.stdit.flavors import stdit_config
from nemo_vfm.models.wan.flavors import wan_config

B = 2


def measured(net, *args, **kwargs) -> tuple[int, int]:
    """``(linear, attention)`` FLOPs that FlopCounterMode sees in one forward of ``net``."""
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        net(*args, **kwargs)
    counts = {str(op): n for op, n in fc.get_flop_counts()["Global"].items()}
    attention = counts.pop("aten.bmm", 0) + counts.pop("aten.baddbmm", 0)
    return sum(counts.values()), attention


def assert_counted(cfg, args: tuple, kwargs: dict, grid, text_len: int | None):
    torch.manual_seed(0)
    net = cfg.build().eval()
    got = family_spec(cfg).flops(cfg, [grid[0] * grid[1] * grid[2]] * B, None if text_len is None else [text_len] * B,
                                 [grid] * B)
    assert (got.linear, got.attention) == measured(net, *args, **kwargs)
    assert got.attention > 0 and got.linear > 0


def _inputs(channels: int, latent=(3, 8, 4), text: tuple[int, int] | None = None):
    x = torch.randn(B, channels, *latent)
    if text is None:
        return (x, torch.rand(B)), {}
    mask = torch.ones(B, text[0], dtype=bool)
    mask[0, -2:] = False  # a masked cross-attention counts the same
    return (x, torch.rand(B)), {"context": torch.randn(B, *text), "context_mask": mask}


GRID = (3, 4, 2)  # latent (3, 8, 4) in (1, 2, 2) patches: t != h * w, so mixing up the frame axis would show


@pytest.mark.parametrize("overrides", [
    dict(context_dim=32, adaln_lora_rank=8, mlp="swiglu", fps_embed=True),
    dict(context_dim=None, num_classes=10, learned_sigma=True, pos_embed="sincos3d",
         moe=MoEConfig(num_experts=4, expert_ffn_size=32, capacity_factor=1.5, num_shared_experts=1, every=2)),
], ids=["cross-lora-swiglu-fps", "classes-moe"])
def test_dit_count_equals_the_measured_forward(overrides):
    cfg = dit_config("tiny", in_channels=4, **overrides)
    args, kwargs = _inputs(4, text=(5, 32) if cfg.context_dim else None)
    if cfg.fps_embed:
        kwargs["fps"] = torch.full((B,), 24.0)
    if cfg.num_classes:
        kwargs["class_labels"] = torch.tensor([1, 10])
    assert_counted(cfg, args, kwargs, GRID, 5 if cfg.context_dim else None)


@pytest.mark.parametrize("overrides", [dict(context_dim=32), dict(context_dim=None, adaln_lora_rank=8, mlp="swiglu")],
                         ids=["cross-full", "lora-swiglu"])
def test_stdit_count_equals_the_measured_forward(overrides):
    cfg = stdit_config("tiny", in_channels=4, **overrides)  # block 1 also runs full attention
    args, kwargs = _inputs(4, text=(5, 32) if cfg.context_dim else None)
    assert_counted(cfg, args, kwargs, GRID, 5 if cfg.context_dim else None)


@pytest.mark.parametrize("overrides", [
    dict(context_dim=32),
    dict(context_dim=None, fps_embed=True, moe=MoEConfig(num_experts=4, expert_ffn_size=32, routing="top_k", top_k=2)),
], ids=["gqa-cross", "moe-top-k-fps"])
def test_moviegen_count_equals_the_measured_forward(overrides):
    cfg = moviegen_config("tiny", in_channels=4, **overrides)  # 4 query heads, 2 key/value heads
    args, kwargs = _inputs(4, text=(5, 32) if cfg.context_dim else None)
    if cfg.fps_embed:
        kwargs["fps"] = torch.full((B,), 24.0)
    assert_counted(cfg, args, kwargs, GRID, 5 if cfg.context_dim else None)


def test_wan_t2v_count_equals_the_measured_forward():
    """7 prompt tokens: the network pads them to text_len (16) and attends to all 16, which is what is counted."""
    cfg = wan_config("tiny")
    assert cfg.text_len == 16
    args, kwargs = _inputs(4, text=(7, 16))
    assert_counted(cfg, args, kwargs, GRID, 7)


def test_wan_i2v_counts_the_image_tokens():
    cfg = wan_config("tiny", in_channels=8, image_dim=24, image_len=5)
    args, kwargs = _inputs(4, text=(7, 16))
    kwargs.update(cond_latents=torch.randn(B, 4, 3, 8, 4), image_embeds=torch.randn(B, 5, 24))
    assert_counted(cfg, args, kwargs, GRID, 7)
    t2v = family_spec(cfg).flops(wan_config("tiny"), [24], [7])
    assert family_spec(cfg).flops(cfg, [24], [7]).forward > t2v.forward


@pytest.mark.parametrize("audio, projected", [(True, False), (False, False), (True, True)],
                         ids=["audio", "video_only", "audio_projected_text"])
def test_ltx2_count_equals_the_measured_forward(audio, projected):
    """Audio and video streams with gates and text adaLN; video only: the audio stream is neither run nor counted;
    projected text (``prompt_embeddings=False``): no caption projections."""
    cfg = ltx2_config("tiny", gated_attn=True, audio_gated_attn=True, cross_attn_mod=True, audio_cross_attn_mod=True,
                      prompt_embeddings=not projected)
    (x, t), kwargs = _inputs(8, latent=(3, 4, 2), text=(5, 32 if projected else 16))
    kwargs["context_mask"] = kwargs["context_mask"].float()
    if audio:
        kwargs.update(audio=torch.randn(B, 2, 7, 4), audio_context=torch.randn(B, 5, 16))
    torch.manual_seed(0)
    net = cfg.build().eval()
    got = family_spec(cfg).flops(cfg, [24] * B, [5] * B, None, audio_lens=[7 if audio else 0] * B)
    assert (got.linear, got.attention) == measured(net, x, t, **kwargs)
    from nemo_vfm.models.ltx2.flops import audio_frames_for

    assert audio_frames_for(ltx2_config("ltx2_19b"), (16, 16, 24)) == 126  # 121 frames at 24 fps: 5.04 s x 25


def test_every_family_reports_and_an_unknown_config_does_not():
    configs = [dit_config("tiny"), stdit_config("tiny"), moviegen_config("tiny"), wan_config("tiny"),
               cosmos_config("tiny"), hunyuan_config("tiny"), ltx2_config("tiny"), kandinsky6_config("tiny")]
    assert {family_spec(c).name for c in configs} == {s.name for s in _table()}
    for cfg in configs:
        fwd = family_spec(cfg).flops(cfg, [24, 24], [5, 5], [GRID, GRID])
        assert train_step_flops(cfg, [24, 24], [5, 5], [GRID, GRID]) == 3 * fwd.forward > 0
    assert train_step_flops(object(), [24], [5]) is None


def test_input_errors_name_the_fix():
    with pytest.raises(ValueError, match="pass grids"):
        train_step_flops(stdit_config("tiny"), [24], [5])
    with pytest.raises(ValueError, match=r"t \* h \* w == seq_len"):
        train_step_flops(stdit_config("tiny"), [24], [5], [(2, 4, 4)])
    with pytest.raises(ValueError, match="truncate the prompt encoding to 16 tokens"):
        train_step_flops(wan_config("tiny"), [24], [17])
    with pytest.raises(ValueError, match="text_lens"):
        train_step_flops(moviegen_config("tiny"), [24])


# -- the DiT counter by hand ----------------------------------------------------------------------------
def test_dit_xl2_matches_the_paper():
    """DiT-XL/2 at 256 px: the DiT paper's 118.6 GFLOPs are multiply-adds, i.e. 237.2 GFLOPs."""
    f = dit_forward_flops(original_dit_config("xl"), [256])
    assert f.forward / 1e9 == pytest.approx(2 * 118.6, rel=2e-3)
    assert f.train_step == 3 * f.forward


def test_hand_count_with_cross_attention_and_adaln_lora():
    cfg = dit_config("tiny", in_channels=4, context_dim=32, adaln_lora_rank=8)  # 2 layers, D=64, F=256, 4 heads
    s, L, d, f, dc, r = 16, 5, 64, 256, 32, 8
    p = 1 * 2 * 2 * 4
    block_linear = 8 * s * d * d + 4 * s * d * f + 4 * s * d * d + 4 * L * dc * d + 2 * (d * r + r * 9 * d)
    block_attn = 4 * s * s * d + 4 * s * L * d
    embed = 2 * (256 * d + d * d) + 2 * d * 3 * d + 2 * d * 2 * d  # timestep MLP, shared adaLN, final adaLN
    linear = 2 * block_linear + 2 * s * p * d + 2 * s * d * p + embed
    got = dit_forward_flops(cfg, [s], [L])
    assert got.linear == linear
    assert got.attention == 2 * block_attn


def test_packed_segments_count_attention_per_segment():
    cfg = dit_config("tiny", in_channels=4, context_dim=32)
    one = dit_forward_flops(cfg, [64], [8])
    two = dit_forward_flops(cfg, [32, 32], [4, 4])
    assert two.linear > one.linear  # the same tokens and text, but per-sample adaLN and embedders twice
    d = cfg.hidden_size
    assert one.attention - two.attention == cfg.num_layers * (4 * d * (64**2 - 2 * 32**2) + 4 * d * (64 * 8 - 2 * 32 * 4))


def test_swiglu_counts_three_matmuls():
    g = dit_forward_flops(dit_config("tiny", context_dim=None), [16])
    s = dit_forward_flops(dit_config("tiny", context_dim=None, mlp="swiglu"), [16])
    assert s.linear - g.linear == 2 * 2 * 16 * 64 * 256


def test_errors_and_peak():
    cfg = dit_config("tiny", context_dim=32)
    with pytest.raises(ValueError, match="text_lens"):
        dit_forward_flops(cfg, [16])
    with pytest.raises(ValueError, match="seq_lens"):
        dit_forward_flops(cfg, [], [])
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("cpu") is None
    assert mfu(989e12, 2.0, 989.0) == pytest.approx(0.5)


# -- the step log -----------------------------------------------------------------------------------------
def _log_one_step(cfg, batch, device, out):
    """One optimizer step through :class:`ThroughputLogger` with a stand-in trainer; the callback is returned."""
    from nemo_vfm.lightning.throughput import ThroughputLogger

    logged = {}
    module = SimpleNamespace(device=torch.device(device), log_dict=lambda stats, **kw: logged.update(stats))
    trainer = SimpleNamespace(global_step=0, max_steps=1, global_rank=0, strategy=SimpleNamespace())
    cb = ThroughputLogger(1, cfg.patch_size, model_config=cfg, out=out)
    cb.on_train_start(trainer, module)
    cb.on_train_batch_start(trainer, module, batch, 0)
    trainer.global_step = 1  # the optimizer stepped: what Lightning counts before on_train_batch_end
    cb.on_train_batch_end(trainer, module, {"loss": torch.tensor(0.5)}, batch, 0)
    return cb, logged


def test_the_step_log_counts_a_wan_step_as_the_network_computes_it(tmp_path):
    """Wan's tokens come from its config's patch size and its text from ``batch['context']`` (padded to text_len
    by the network): the step's FLOPs are 3x what a real forward of the network on that batch measures."""
    cfg = wan_config("tiny")
    (x, t), kwargs = _inputs(4, text=(7, 16))
    cb, logged = _log_one_step(cfg, {"latents": x, **kwargs}, "cpu", tmp_path / "perf.jsonl")
    ((flops, dense),) = cb._flops_by_shape.values()
    assert flops == dense == 3 * sum(measured(cfg.build().eval(), x, t, **kwargs))
    row = json.loads((tmp_path / "perf.jsonl").read_text())
    assert row["tokens_per_s_per_gpu"] == pytest.approx(B * 24 / (row["step_time_s"]), rel=1e-6)
    assert "model_tflops_per_gpu" not in row  # TFLOP/s and MFU are GPU figures


def test_the_step_log_gives_packed_stdit_segments_their_grids():
    from nemo_vfm.lightning.throughput import ThroughputLogger

    cfg = stdit_config("tiny", in_channels=4, context_dim=32)
    packed = SimpleNamespace(seq_lens=torch.tensor([24, 16]), cu_seqlens_text=torch.tensor([0, 5, 8]),
                             latent_shapes=torch.tensor([[4, 3, 8, 4], [4, 1, 8, 8]]), patch_size=(1, 2, 2))
    want = 3 * sum(f.forward for f in [
        family_spec(cfg).flops(cfg, [24], [5], [(3, 4, 2)]), family_spec(cfg).flops(cfg, [16], [3], [(1, 4, 4)])])
    assert ThroughputLogger(1, cfg.patch_size, model_config=cfg)._packed_flops(packed) == (want, want)


@pytest.mark.gpu
def test_a_wan_step_on_a_gpu_logs_model_tflops_and_mfu(tmp_path):
    cfg = wan_config("tiny")
    (x, _), kwargs = _inputs(4, text=(7, 16))
    batch = {"latents": x.cuda(), **{k: v.cuda() for k, v in kwargs.items()}}
    _, logged = _log_one_step(cfg, batch, "cuda", tmp_path / "perf.jsonl")
    row = json.loads((tmp_path / "perf.jsonl").read_text())
    assert row["model_tflops_per_gpu"] > 0 and logged["perf/model_tflops_per_gpu"] == row["model_tflops_per_gpu"]
    if peak_tflops(torch.cuda.get_device_name()):
        assert row["mfu"] == pytest.approx(row["model_tflops_per_gpu"] / peak_tflops(torch.cuda.get_device_name()))


# -- sparse self-attention: the FLOPs computed -------------------------------------------------------------
def test_sta_counts_the_kept_tile_pairs_and_keeps_the_dense_figure():
    """Wan with STA in block 1 (block 0 dense): the computed attention is the dense count with block 1's
    self-attention scaled by the share of tile pairs its mask keeps (read from the mask itself)."""
    from nemo_vfm.parallel.sparse_attention import SparsePattern, sta_tile_mask

    grid, tile, window = (3, 4, 6), (1, 2, 2), (1, 1, 3)
    sparse = wan_config("tiny", attention="sta", attention_tile=tile, attention_window=window, attention_dense_blocks=(0,))
    dense = wan_config("tiny")
    s, d = 72, dense.hidden_size
    mask = sta_tile_mask(SparsePattern(kind="sta", grid_thw=grid, tile=tile, window=window))
    kept = mask.sum().item() / mask.numel()
    assert kept == pytest.approx(3 / 18)  # 18 tiles, each query tile keeps 1 x 1 x 3 of them
    got = family_spec(sparse).flops(sparse, [s] * B, [7] * B, [grid] * B)
    want = family_spec(dense).flops(dense, [s] * B, [7] * B, [grid] * B)
    self_attention = 4 * s * s * d  # one block, one sample
    assert got.linear == want.linear and got.dense_attention == want.attention and want.dense_attention is None
    assert got.attention == pytest.approx(want.attention - B * (1 - kept) * self_attention, rel=1e-9)
    assert got.train_step == 3 * (got.linear + got.attention)
    assert got.dense_equivalent_train_step == want.train_step
    with pytest.raises(ValueError, match="pass grids"):
        family_spec(sparse).flops(sparse, [s] * B, [7] * B)


def test_vsa_adds_its_coarse_attention_and_gate():
    """DiT with VSA: the kept half of the key tiles, the coarse attention over the tiles, and the gate projection
    (whose linear FLOPs FlopCounterMode measures on the network)."""
    cfg = dit_config("tiny", context_dim=32, attention="vsa", attention_tile=(1, 2, 2), attention_sparsity=0.5)
    dense_cfg = dit_config("tiny", context_dim=32)
    s, d, n = 24, cfg.hidden_size, 6  # GRID (3, 4, 2) in tiles of (1, 2, 2): 3 x 2 x 1 tiles, top-3 kept
    got = family_spec(cfg).flops(cfg, [s] * B, [16] * B, [GRID] * B)
    want = family_spec(dense_cfg).flops(dense_cfg, [s] * B, [16] * B, [GRID] * B)
    blocks = B * cfg.num_layers
    assert got.linear == want.linear + blocks * 2 * s * d * d
    assert got.attention == want.attention - blocks * 0.5 * 4 * s * s * d + blocks * 4 * n * n * d
    assert got.dense_attention == want.attention
    (x, t), kwargs = _inputs(cfg.in_channels, text=(16, 32))
    torch.manual_seed(0)
    net = cfg.build().eval()  # with gradients enabled the CPU runs the masked dense path, which FlopCounterMode sees
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        net(x, t, **kwargs)
    counts = {str(op): n for op, n in fc.get_flop_counts()["Global"].items()}
    assert sum(n for op, n in counts.items() if op not in ("aten.bmm", "aten.baddbmm")) == got.linear


def test_the_step_log_reports_computed_flops_and_labels_the_dense_equivalent():
    from nemo_vfm.lightning.throughput import ThroughputLogger

    cfg = wan_config("tiny", attention="sta", attention_tile=(1, 2, 2), attention_window=(1, 1, 3))
    (x, _), kwargs = _inputs(4, latent=(3, 8, 12), text=(7, 16))
    cb = ThroughputLogger(1, cfg.patch_size, model_config=cfg)
    computed, dense = cb._step_flops({"latents": x, **kwargs}, x)
    flops = family_spec(cfg).flops(cfg, [72] * B, [7] * B, [(3, 4, 6)] * B)
    assert (computed, dense) == (flops.train_step, flops.dense_equivalent_train_step) and computed < dense
    cb._flops, cb._peak, stats = (computed, dense), 989.0, {}
    line = cb._flops_line(1e-12, 1, stats)  # one second per 1e12 FLOPs: the figures are the FLOPs in TFLOP
    assert stats["perf/model_tflops_per_gpu"] == pytest.approx(computed)
    assert stats["perf/mfu"] == pytest.approx(computed / 989.0)
    assert stats["perf/dense_equivalent_tflops_per_gpu"] == pytest.approx(dense)
    assert line == (f" {computed:.0f} TFLOP/s/gpu MFU {100 * computed / 989:.1f}% "
                    f"(sparse attention; dense-equivalent {dense:.0f} TFLOP/s/gpu)")
    dense_cb = ThroughputLogger(1, cfg.patch_size, model_config=wan_config("tiny"))
    dense_cb._flops, dense_cb._peak = (dense, dense), 989.0
    assert "dense-equivalent" not in dense_cb._flops_line(1e-12, 1, {})  # a dense model: one figure
