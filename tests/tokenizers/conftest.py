"""Tiny shared pieces for the tokenizer tests."""

import pytest
import torch

from nemo_vfm.tokenizers.causal import CausalVideoTokenizer


def tiny_causal(tc=4, sc=8, patch_size=1, **kw) -> CausalVideoTokenizer:
    """A random-weight causal tokenizer, width 8; weights scaled up so every layer matters."""
    torch.manual_seed(0)
    model = CausalVideoTokenizer(temporal_compression=tc, spatial_compression=sc, patch_size=patch_size,
                                 latent_channels=4, width=8, max_mult=2, **kw).eval()
    with torch.no_grad():  # zero-initialized residual branches would make the test trivially local
        for m in model.modules():
            if isinstance(m, torch.nn.Conv3d):
                m.weight.normal_(0, (1.0 / m.weight[0].numel()) ** 0.5)
    return model


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to the spread of b."""
    return float((a - b).abs().max() / b.std())


@pytest.fixture(autouse=True)
def one_cpu_thread():
    """Two OpenMP threads on a shared 2-core machine can run 50x slower than one: use one, then restore."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def video():
    torch.manual_seed(1)
    return torch.rand(1, 3, 9, 64, 96) * 2 - 1
