"""Compiled blocks give the eager gradients where Inductor's mix-order reduction would not: adaLN
modulation broadcast over a local batch of 1 at 32k tokens (pytorch/pytorch#193061; see
``nemo_vfm/parallel/compile.py``). GPU only: ``python -m pytest -q -m gpu tests/parallel/test_compile_gpu.py``.
"""

import pytest
import torch

from nemo_vfm.models.dit.model import DiTConfig
from nemo_vfm.parallel.compile import compile_blocks

pytestmark = pytest.mark.gpu


def _grads(compiled: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    cfg = DiTConfig(num_layers=2, hidden_size=1024, num_heads=16, in_channels=4, context_dim=None,
                    pos_embed="sincos3d")
    model = cfg.build("cuda")
    with torch.no_grad():  # non-zero adaLN and output layers, so that every modulation gets a gradient
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    if compiled:
        compile_blocks(model.blocks)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(1, 4, 8, 128, 128, device="cuda", generator=g)  # 8 x 64 x 64 = 32,768 tokens
    t = torch.rand(1, device="cuda", generator=g)
    model(x, t).square().mean().backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if "blocks" in n}


def test_compiled_block_gradients_equal_eager_at_batch_1_long_sequence():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    ref, got = _grads(False), _grads(True)
    worst = max(((got[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref)
    assert worst < 1e-3, {n: ((got[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref if "adaln" in n}
