"""Wan I2V generation on 2 gloo processes (CP2 ring, CP2 all-to-all, CFG-parallel, TP2 with SP, and a Wan
weights folder streamed into a TP2 engine) gives the latents of one process."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
from gloo_launcher import run_distributed  # noqa: E402

from nemo_vfm.inference.generate import SamplingConfig, generate_latents  # noqa: E402
from nemo_vfm.models.wan.flavors import wan_objective  # noqa: E402
from nemo_vfm.models.wan.model import WanConfig  # noqa: E402

SHAPE = (4, 3, 4, 4)  # (C, t, h, w): 12 video tokens with patch (1, 2, 2)
RTOL = 5e-5
CASES = {"cp2_ring": dict(cp=2, cp_kind="ring"), "cp2_a2a": dict(cp=2, cp_kind="a2a"),
         "cfg_parallel": dict(cp=1, cfg_parallel=True), "tp2": dict(cp=1, tp=2)}


def _cfg():
    return WanConfig(num_layers=2, hidden_size=48, num_heads=4, ffn_size=64, in_channels=12, out_channels=4,
                     context_dim=8, freq_dim=16, text_len=6, image_dim=16)


def _net():
    torch.manual_seed(0)
    net = _cfg().build()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return net.eval()


def _conds():
    g = torch.Generator().manual_seed(1)
    image = {"image_embeds": torch.randn(2, 5, 16, generator=g), "cond_latents": torch.randn(2, 8, 3, 4, 4, generator=g)}
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]]).bool()
    cond = {"context": torch.randn(2, 3, 8, generator=g), "context_mask": mask, **image}
    uncond = {"context": torch.randn(2, 3, 8, generator=g), "context_mask": mask, **image}  # a "negative prompt"
    return cond, uncond


SAMPLING = SamplingConfig(num_steps=3, guidance=4.0, sampler="flow-euler", seed=7)


def _worker(rank, world, folder):
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.distributed import InferenceLayout

    out = {}
    for name, kw in CASES.items():
        engine = InferenceEngine.from_model(_net(), wan_objective("i2v_14b_480p"), InferenceLayout(**kw), device="cpu")
        out[name] = engine.denoise(*_conds(), SHAPE, SAMPLING)
    engine = InferenceEngine.from_checkpoint(folder, InferenceLayout(cp=1, tp=2), device="cpu", dtype="fp32",
                                             build_encoders=False)
    out["folder_tp2"] = engine.denoise(*_conds(), SHAPE, SAMPLING)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from nemo_vfm.models.wan.convert import save_weights

    folder = tmp_path_factory.mktemp("wan")
    save_weights(_net().state_dict(), folder, _cfg(), layout="original")
    return run_distributed(_worker, 2, str(folder), timeout=240)


@pytest.mark.parametrize("name", [*CASES, "folder_tp2"])
def test_wan_layout_matches_single_process(results, name):
    ref = generate_latents(_net(), wan_objective("i2v_14b_480p"), SHAPE, *_conds(), SAMPLING)
    assert ref.abs().max() > 0.1 and torch.isfinite(ref).all()
    for r in range(2):
        got = results[r][name]
        assert got.shape == ref.shape
        assert (got - ref).abs().max().item() <= RTOL * ref.abs().max().item(), (name, r, (got - ref).abs().max())
