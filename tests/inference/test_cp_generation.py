"""Multi-process generation (gloo, CPU, fp32) gives the latents and videos of one process.

One spawn of 2 processes runs every 2-rank layout: CP2 ring, CP2 all-to-all, CFG-parallel, TP2 (+SP),
with the Heun, RES and flow-matching Euler samplers; then loads a checkpoint (Lightning DCP folder,
safetensors export) into CP2 / TP2 / CFG-parallel engines and generates decoded videos end to end,
with the decode tiles dealt to both ranks.
"""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
from gloo_launcher import run_distributed  # noqa: E402

from nemo_vfm.diffusion.conditioning import null_condition  # noqa: E402
from nemo_vfm.diffusion.edm import EDM  # noqa: E402
from nemo_vfm.diffusion.flow_matching import FlowMatching  # noqa: E402
from nemo_vfm.inference.generate import SamplingConfig, generate_latents  # noqa: E402
from nemo_vfm.models.dit.model import DiTConfig  # noqa: E402

SHAPE = (4, 2, 4, 4)  # (C, t, h, w): 8 video tokens with patch (1, 2, 2)
PROMPTS = ["a red circle moving left", "a blue square"]
GEN = {"tokenizer": {"name": "identity", "kwargs": {"spatial_compression": 2}},
       "text_encoder": {"name": "hash", "kwargs": {"dim": 8, "max_length": 4}},
       "latent_shape": [12, 2, 4, 4], "fps": None}
# latents: max |diff| / max |ref|; measured 0 (all-to-all, CFG-parallel), 1.6e-6 (TP2),
# 6e-6 .. 1e-5 (ring: key blocks merged through their log-sum-exp)
RTOL = 5e-5
VIDEO_ATOL = 1e-3  # decoded videos in [-1, 1] (TP2 with Heun measured 1.3e-4: row-parallel sums in another order)


def _net(in_channels=4, family="dit"):
    if family == "stdit":
        from nemo_vfm.models.stdit.flavors import stdit_config

        cfg = stdit_config("tiny", in_channels=in_channels, context_dim=8)
    elif family == "moviegen":
        from nemo_vfm.models.moviegen.flavors import moviegen_config

        cfg = moviegen_config("tiny", in_channels=in_channels, context_dim=8)
    else:
        cfg = DiTConfig(num_layers=2, hidden_size=32, num_heads=4, in_channels=in_channels, context_dim=8,
                        adaln_lora_rank=4)
    net = cfg.build()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in net.parameters():  # away from the adaLN-Zero start, where every layout trivially agrees
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return net.eval()


def _cond():
    g = torch.Generator().manual_seed(1)
    cond = {"context": torch.randn(2, 3, 8, generator=g), "context_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]).bool()}
    return cond, null_condition(cond)


CASES = {  # name: (layout kwargs, objective, sampler)
    "cp2_ring_heun": (dict(cp=2, cp_kind="ring"), "edm", "heun"),
    "cp2_a2a_res": (dict(cp=2, cp_kind="a2a"), "edm", "res"),
    "cfg_parallel_heun": (dict(cp=1, cfg_parallel=True), "edm", "heun"),
    "tp2_sp_euler": (dict(cp=1, tp=2), "edm", "euler"),
    "cp2_flow": (dict(cp=2), "flow", "flow-euler"),
    "stdit_cp2_ring": (dict(cp=2, cp_kind="ring"), "edm", "heun"),  # the other model families' plans
    "moviegen_cp2": (dict(cp=2), "edm", "res"),
}


def _family(name):
    return name.split("_")[0] if name.startswith(("stdit", "moviegen")) else "dit"


def _objective(name):
    return EDM() if name == "edm" else FlowMatching(shift=3.0)


def _sampling(sampler):
    return SamplingConfig(num_steps=3, guidance=4.0, sampler=sampler, seed=7)


def _tiled_tokenizer():
    """A tiny random causal tokenizer, tiled without halo (so tiled != untiled: the blend itself is tested)."""
    from nemo_vfm.tokenizers.causal import CausalVideoTokenizer
    from nemo_vfm.tokenizers.tiling import TiledTokenizer

    torch.manual_seed(0)
    tok = CausalVideoTokenizer(temporal_compression=2, spatial_compression=4, latent_channels=4, width=8, max_mult=1)
    return TiledTokenizer(tok.eval(), tile_size=16, tile_overlap=8, tile_halo=0)


def _latents_to_decode():
    return torch.randn(1, 4, 2, 8, 8, generator=torch.Generator().manual_seed(3))


def _layouts_worker(rank, world, ckpts):
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.decode import decode_latents
    from nemo_vfm.inference.distributed import InferenceLayout

    out = {"tiled_decode": decode_latents(_tiled_tokenizer(), _latents_to_decode())}
    cond, uncond = _cond()
    for name, (kw, obj, sampler) in CASES.items():
        engine = InferenceEngine.from_model(_net(family=_family(name)), _objective(obj), InferenceLayout(**kw),
                                            device="cpu")
        out[name] = engine.denoise(cond, uncond, SHAPE, _sampling(sampler))
    for name, (path, kw) in ckpts.items():
        engine = InferenceEngine.from_checkpoint(path, InferenceLayout(**kw), device="cpu", dtype="fp32")
        videos, times = engine.generate(PROMPTS, sampling=_sampling("heun"))
        out[name] = (videos, sorted(times))
    return out


def _write_checkpoints(tmp: Path) -> dict:
    """A Lightning DCP folder (as VFMParallelStrategy writes it) and a safetensors export of it."""
    import torch.distributed.checkpoint as dcp

    from nemo_vfm.inference.checkpoint import export_safetensors

    net = _net(in_channels=12)
    state = {f"model.{k}": v * 0 for k, v in net.state_dict().items()}  # raw weights: zeros (EMA must win)
    state.update({f"ema.{k}": v for k, v in net.state_dict().items()})
    folder = tmp / "checkpoints" / "step=00000003.ckpt"
    dcp.save({"state_dict": state}, checkpoint_id=str(folder), no_dist=True)
    torch.save({"hyper_parameters": {"model_config": net.cfg, "objective": EDM(), "generation": GEN},
                "global_step": 3}, folder / "meta.pt")
    st = export_safetensors(tmp, tmp / "dit.safetensors")
    return {"dcp_cp2": (str(tmp), dict(cp=2)), "dcp_tp2": (str(folder), dict(tp=2)),
            "st_cfg_parallel": (str(st), dict(cfg_parallel=True))}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    ckpts = _write_checkpoints(tmp_path_factory.mktemp("ckpt"))
    return ckpts, run_distributed(_layouts_worker, 2, ckpts, timeout=240)


def _close(a, b):
    return (a - b).abs().max().item() <= RTOL * b.abs().max().item()


@pytest.mark.parametrize("name", list(CASES))
def test_layout_matches_single_process(results, name):
    _, per_rank = results
    kw, obj, sampler = CASES[name]
    cond, uncond = _cond()
    ref = generate_latents(_net(family=_family(name)), _objective(obj), SHAPE, cond, uncond, _sampling(sampler))
    assert ref.abs().max() > 0.1 and torch.isfinite(ref).all()
    for r in range(2):  # every rank ends with the full latents
        got = per_rank[r][name]
        assert got.shape == ref.shape and _close(got, ref), (name, r, (got - ref).abs().max().item())


@pytest.mark.parametrize("name", ["dcp_cp2", "dcp_tp2", "st_cfg_parallel"])
def test_checkpoint_generation_matches_single_process(results, name):
    from nemo_vfm.inference.checkpoint import load_checkpoint
    from nemo_vfm.inference.generate import generate_videos
    from nemo_vfm.tokenizers.hash_text import HashTextEncoder
    from nemo_vfm.tokenizers.identity import IdentityTokenizer

    ckpts, per_rank = results
    loaded = load_checkpoint(ckpts[name][0])
    assert loaded.step == 3 and loaded.generation == GEN
    ref, _ = generate_videos(loaded.net, loaded.objective, IdentityTokenizer(2), HashTextEncoder(dim=8, max_length=4),
                             PROMPTS, GEN["latent_shape"], _sampling("heun"))
    videos, stages = per_rank[0][name]
    assert stages == ["decode_s", "denoise_s", "text_encode_s"]
    assert videos.shape == (2, 3, 2, 8, 8) and (videos - ref).abs().max().item() < VIDEO_ATOL, (videos - ref).abs().max()
    assert per_rank[1][name][0] is None  # videos land on rank 0 only


def test_tiles_decoded_on_two_ranks_blend_like_one_process(results):
    _, per_rank = results
    tok = _tiled_tokenizer()
    z = _latents_to_decode()
    ref = tok.decode(z).clamp(-1, 1)
    untiled = tok.inner.decode(z).clamp(-1, 1)
    assert (ref - untiled).abs().max() > 1e-3  # the tiles really blend (no halo)
    got = per_rank[0]["tiled_decode"]
    assert got.shape == ref.shape == (1, 3, 3, 32, 32) and (got - ref).abs().max() < 1e-5
    assert per_rank[1]["tiled_decode"] is None


def _four_worker(rank, world):
    from nemo_vfm.inference.cp_engine import InferenceEngine
    from nemo_vfm.inference.distributed import InferenceLayout

    engine = InferenceEngine.from_model(_net(), EDM(), InferenceLayout.for_world(world, cfg_parallel=True), device="cpu")
    assert engine.layout.cp == 2 and engine.layout.resolved_cp_kind(4) == "a2a"
    return engine.denoise(*_cond(), SHAPE, _sampling("heun"))


@pytest.mark.slow
def test_cfg_parallel_times_cp2_on_four_processes_matches_single_process():
    ref = generate_latents(_net(), EDM(), SHAPE, *_cond(), _sampling("heun"))
    for got in run_distributed(_four_worker, 4, timeout=240):
        assert _close(got, ref), (got - ref).abs().max().item()
