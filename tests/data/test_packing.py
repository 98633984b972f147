"""First-fit-decreasing packing of a known length distribution; THD layout bookkeeping."""

import random

import pytest
import torch

from nemo_vfm.data.batch import TokenSample
from nemo_vfm.data.packing import (
    concat_packs,
    cu_seqlens,
    first_fit_decreasing,
    pack_samples,
    packing_efficiency,
    padded_length,
)


def test_ffd_known_distribution():
    rng = random.Random(0)
    cap = 4096
    # images (64..256 tokens), short clips (512..1024) and long clips (2048..4096): what mixed training sees
    lengths = ([rng.randint(64, 256) for _ in range(200)] + [rng.randint(512, 1024) for _ in range(100)]
               + [rng.randint(2048, cap) for _ in range(30)] + [cap + 1, 9000])
    bins, too_long = first_fit_decreasing(lengths, cap)
    placed = sorted(i for b in bins for i in b)
    assert sorted(too_long) == [330, 331]  # longer than a bin: left out, never split
    assert placed == sorted(set(range(len(lengths))) - set(too_long))  # every other sample exactly once
    assert all(sum(lengths[i] for i in b) <= cap for b in bins)  # capacity respected
    eff = packing_efficiency(bins, lengths, cap)
    lower_bound = sum(lengths[i] for i in placed) / cap  # bins can never beat this
    assert len(bins) <= int(lower_bound * 11 / 9) + 1  # FFD guarantee: <= 11/9 OPT + 6/9
    assert eff > 0.9, eff
    print(f"FFD: {len(placed)} samples in {len(bins)} bins of {cap}, efficiency {eff:.3f}")


def test_ffd_deterministic_and_validates():
    assert first_fit_decreasing([3, 3, 2, 2], 5) == ([[0, 2], [1, 3]], [])
    with pytest.raises(ValueError, match="capacity"):
        first_fit_decreasing([1], 0)
    assert padded_length(13, 8) == 16 and padded_length(16, 8) == 16
    assert cu_seqlens([3, 5]).tolist() == [0, 3, 8]


def _sample(key, n, text_len, d=4):
    return TokenSample(key=key, tokens=torch.randn(n, 6), pos_ids=torch.zeros(n, 3, dtype=torch.long),
                       loss_mask=torch.ones(n), text=torch.randn(text_len, d), latent_shape=(6, 1, 1, n),
                       patch_size=(1, 1, 1), fps=8.0, num_real_tokens=n)


def test_pack_samples_layout_and_padding():
    b = pack_samples([_sample("a", 5, 2), _sample("b", 8, 3), _sample("c", 1, 1)], pad_to_multiple=4, capacity=32)
    assert b.cu_seqlens.tolist() == [0, 8, 16, 20]  # 5->8, 8->8, 1->4
    assert b.cu_seqlens_text.tolist() == [0, 2, 5, 6]
    assert b.seq_lens.tolist() == [5, 8, 1]
    assert b.loss_mask.tolist() == [1] * 5 + [0] * 3 + [1] * 8 + [1] + [0] * 3
    assert b.seg_ids.tolist() == [0] * 8 + [1] * 8 + [2] * 4
    assert b.efficiency == pytest.approx(14 / 32)
    two = concat_packs([b, b])
    assert two.cu_seqlens.tolist() == [0, 8, 16, 20, 28, 36, 40]
    assert two.seg_ids.max() == 5 and two.capacity == 64 and two.num_segments == 6
