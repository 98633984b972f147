"""Compiled vs eager DiT block gradients at batch 1 and 32k tokens (GPU), with Inductor's mix-order
reduction on (torch's default) and off (what ``nemo_vfm.parallel.compile`` does):

    python bench/compile_grad_check.py

Prints the worst relative gradient error of each (or the backward's error). Why it matters: see
``nemo_vfm/parallel/compile.py``.
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "parallel"))

import test_compile_gpu as T  # noqa: E402

import nemo_vfm.parallel.compile as C  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
print(torch.cuda.get_device_name(), torch.__version__)
ref = T._grads(False)
for label, patch in (("mix-order reduction ON (torch default)", True), ("OFF (nemo_vfm.parallel.compile)", False)):
    torch._dynamo.reset()
    if patch:
        orig = C.disable_mix_order_reduction
        C.disable_mix_order_reduction = lambda: None
    try:
        got = T._grads(True)
    except RuntimeError as e:
        print(label, "-> backward failed:", str(e).splitlines()[0][:160])
        continue
    finally:
        if patch:
            C.disable_mix_order_reduction = orig
    errs = {n: ((got[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref}
    worst = max(errs, key=errs.get)
    print(f"{label}: worst rel err {errs[worst]:.2e} ({worst})")
