"""Compiled blocks give the eager gradients where Inductor's mix-order reduction would not: adaLN
modulation broadcast over a local batch of 1 at 32k tokens (pytorch/pytorch#193061; see
``nemo_vfm/parallel/compile.py``); and Wan blocks compiled under ``save_attention`` checkpointing give the
eager, un-checkpointed gradients at 32,760 tokens. GPU only:
``python -m pytest -q -m gpu tests/parallel/test_compile_gpu.py``.
"""

import pytest
import torch

from bench.compile_grad_check import block_grads  # the same case the bench script runs
from nemo_vfm.parallel.compile import compile_blocks

pytestmark = pytest.mark.gpu


def test_compiled_block_gradients_equal_eager_at_batch_1_long_sequence():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    ref, got = block_grads(False), block_grads(True)
    worst = max(((got[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref)
    assert worst < 1e-3, {n: ((got[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref if "adaln" in n}


def _wan_grads(compiled: bool) -> dict[str, torch.Tensor]:
    """A 2-block Wan of the 1.3B width at 480p x 81 frames (32,760 tokens), fp32: eager without checkpointing,
    or compiled with ``save_attention`` checkpointing (what the Wan recipes train with)."""
    from nemo_vfm.models.wan.flavors import wan_config
    from nemo_vfm.parallel.activation_checkpoint import apply_activation_checkpointing

    torch.manual_seed(0)
    model = wan_config("t2v_1_3b", num_layers=2).build("cuda")
    with torch.no_grad():  # a non-zero output layer, so that every block parameter gets a gradient
        model.head.head.weight.normal_(std=0.02)
    if compiled:
        apply_activation_checkpointing(model.blocks, "save_attention")
        compile_blocks(model.blocks)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(1, 16, 21, 60, 104, device="cuda", generator=g)
    t, ctx = torch.rand(1, device="cuda", generator=g), torch.randn(1, 512, 4096, device="cuda", generator=g)
    model(x, t, ctx).square().mean().backward()
    return {n.replace("_checkpoint_wrapped_module.", ""): p.grad.detach().clone()
            for n, p in model.named_parameters() if "blocks" in n}


def test_wan_compiled_save_attention_gradients_equal_eager():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    ref, got = _wan_grads(False), _wan_grads(True)
    assert got.keys() == ref.keys()
    errs = {n: ((got[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref}
    assert max(errs.values()) < 1e-3, errs
