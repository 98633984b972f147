"""The analytic FLOP counter against hand counts."""

import pytest

from nemo_vfm.models.dit.flavors import dit_config, original_dit_config
from nemo_vfm.models.flops import dit_forward_flops, mfu, peak_tflops


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
