"""Compiled vs eager DiT block gradients at batch 1 and 32k tokens (GPU), with Inductor's mix-order
reduction on (torch's default) and off (what ``nemo_vfm.parallel.compile`` does):

    python bench/compile_grad_check.py

Prints the worst relative gradient error of each (or the backward's error). Why it matters: see
``nemo_vfm/parallel/compile.py``. The model and input are those of ``tests/parallel/test_compile_gpu.py``.
"""

import torch

import nemo_vfm.parallel.compile as C
from nemo_vfm.models.dit.model import DiTConfig


def block_grads(compiled: bool) -> dict[str, torch.Tensor]:
    """Gradients of a 2-block DiT's blocks (hidden 1024, fp32) on one 8 x 128 x 128 latent (32,768 tokens)."""
    torch.manual_seed(0)
    cfg = DiTConfig(num_layers=2, hidden_size=1024, num_heads=16, in_channels=4, context_dim=None,
                    pos_embed="sincos3d")
    model = cfg.build("cuda")
    with torch.no_grad():  # non-zero adaLN and output layers, so that every modulation gets a gradient
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    if compiled:
        C.compile_blocks(model.blocks)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(1, 4, 8, 128, 128, device="cuda", generator=g)  # 8 x 64 x 64 = 32,768 tokens
    t = torch.rand(1, device="cuda", generator=g)
    model(x, t).square().mean().backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if "blocks" in n}


def main() -> int:
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    print(torch.cuda.get_device_name(), torch.__version__)
    ref = block_grads(False)
    for label, patch in (("mix-order reduction ON (torch default)", True), ("OFF (nemo_vfm.parallel.compile)", False)):
        torch._dynamo.reset()
        if patch:
            orig = C.disable_mix_order_reduction
            C.disable_mix_order_reduction = lambda: None
        try:
            got = block_grads(True)
        except RuntimeError as e:
            print(label, "-> backward failed:", str(e).splitlines()[0][:160])
            continue
        finally:
            if patch:
                C.disable_mix_order_reduction = orig
        errs = {n: ((got[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref}
        worst = max(errs, key=errs.get)
        print(f"{label}: worst rel err {errs[worst]:.2e} ({worst})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
