"""``DiffusionModule.prepare_host_batch``: an all-True text mask is dropped on the host for the networks that read
the same without it (DiT, ST-DiT, MovieGen), also for condition dropout's null rows, and kept everywhere else."""

import pytest
import torch

from nemo_vfm.data.batch import VideoBatch
from nemo_vfm.diffusion.conditioning import null_condition
from nemo_vfm.lightning.module import DiffusionModule
from nemo_vfm.lightning.strategy import VFMParallelStrategy
from nemo_vfm.models.dit.flavors import dit_config
from nemo_vfm.models.moviegen.flavors import moviegen_config
from nemo_vfm.models.stdit.flavors import stdit_config

CTX = 16
FAMILIES = {"dit": dit_config, "stdit": stdit_config, "moviegen": moviegen_config}


def _net(family: str):
    torch.manual_seed(0)
    net = FAMILIES[family]("tiny", in_channels=4, context_dim=CTX).build()
    with torch.no_grad():
        for p in net.parameters():  # adaLN-Zero starts with zero gates: randomise so text changes the output
            p.normal_(0, 0.2)
    return net.eval()


def _inputs(batch: int = 2):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(batch, 4, 2, 4, 4, generator=g), torch.rand(batch, generator=g),
            torch.randn(batch, 5, CTX, generator=g))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_all_true_mask_reads_as_no_mask_also_for_dropped_rows(family):
    net = _net(family)
    assert net.text_mask_droppable
    x, t, ctx = _inputs()
    full = torch.ones(2, 5, dtype=torch.bool)
    torch.testing.assert_close(net(x, t, ctx, full), net(x, t, ctx, None), rtol=0, atol=1e-6)
    # condition dropout: row 1 becomes the null condition (zero text, all-False mask); without the mask it reads
    # zero text at every position, which is what the all-False row attends to
    null = null_condition({"context": ctx, "context_mask": full})
    ctx_d, mask_d = torch.stack([ctx[0], null["context"][1]]), torch.stack([full[0], null["context_mask"][1]])
    torch.testing.assert_close(net(x, t, ctx_d, mask_d), net(x, t, ctx_d, None), rtol=0, atol=1e-6)
    # a real mask changes the output: dropping it would be wrong
    part = full.clone()
    part[0, 3:] = False
    assert not torch.allclose(net(x, t, ctx, part), net(x, t, ctx, None), atol=1e-4)


def _module(net) -> DiffusionModule:
    module = DiffusionModule(None, objective=None, ema_decay=None)
    module.model = net
    return module


def test_prepare_host_batch_drops_only_all_true_masks_of_droppable_networks():
    module = _module(_net("dit"))
    x, _, ctx = _inputs()
    full = torch.ones(2, 5, dtype=torch.bool)
    out = module.prepare_host_batch({"latents": x, "context": ctx, "context_mask": full})
    assert out["context_mask"] is None and out["context"] is ctx
    part = full.clone()
    part[1, 4] = False
    batch = {"latents": x, "context": ctx, "context_mask": part}
    assert module.prepare_host_batch(batch) is batch  # two captions of different lengths keep their mask
    vb = VideoBatch(latents=x, context=ctx, context_mask=full, fps=torch.ones(2), sample_keys=["a", "b"], meta=[{}, {}])
    assert module.prepare_host_batch(vb).context_mask is None and vb.context_mask is full
    # a network that reads text otherwise (Wan, HunyuanVideo, ...) keeps every mask
    plain = _module(torch.nn.Linear(2, 2))
    batch = {"latents": x, "context": ctx, "context_mask": full}
    assert plain.prepare_host_batch(batch) is batch


def test_strategy_prepares_the_batch_on_the_host_before_the_copy():
    module = _module(_net("stdit"))
    strategy = VFMParallelStrategy()  # the recipes' defaults (compile='auto': eager on the CPU)
    strategy._lightning_module = module
    x, _, ctx = _inputs()
    out = strategy.batch_to_device({"latents": x, "context": ctx, "context_mask": torch.ones(2, 5, dtype=torch.bool)},
                                   torch.device("cpu"))
    assert out["context_mask"] is None and torch.equal(out["latents"], x)
    vb = VideoBatch(latents=x, context=ctx, context_mask=torch.ones(2, 5, dtype=torch.bool), fps=torch.ones(2),
                    sample_keys=["a", "b"], meta=[{}, {}])
    out = strategy.batch_to_device(vb, "cpu")
    assert isinstance(out, VideoBatch) and out.context_mask is None and torch.equal(out.latents, x)


@pytest.mark.gpu
def test_compiled_cuda_blocks_read_an_all_true_mask_as_none():
    """On the GPU the masked and unmasked cross-attention are different cuDNN kernels (with and without a bias):
    the compiled network gives the same output either way, up to bf16 rounding."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from nemo_vfm.parallel.compile import compile_blocks
    from nemo_vfm.parallel.sdpa_backend import select_sdpa_backend

    select_sdpa_backend("cudnn")
    torch.manual_seed(0)
    net = dit_config("tiny", in_channels=4, context_dim=CTX, hidden_size=256, num_heads=4).build("cuda")
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.05)
    compile_blocks(net.blocks)
    x, t, ctx = (v.cuda() for v in _inputs())
    full = torch.ones(2, 5, dtype=torch.bool, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        a, b = net(x, t, ctx, full).float(), net(x, t, ctx, None).float()
    assert (a - b).norm() / b.norm() < 2e-2
