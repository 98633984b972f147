"""Exports of an LTX-2 LoRA run. ``--format comfyui``: every key is one ComfyUI's LoraLoader reads for its LTX-2
(LTXAV) model, whose module names are the release's (ours), and the patched release weights equal our merged
``--format original`` export (ComfyUI's LoRA path is re-implemented in tests/inference/test_comfyui_lora.py).
``--format lora``: diffusers loads the adapters and reproduces our merged network. ``vfm generate`` refuses an LTX-2
training run (it samples LTX2Pipeline folders)."""

import pytest
import torch
from safetensors.torch import load_file

from nemo_vfm.cli.main import main
from nemo_vfm.diffusion.audio_video import AudioVideoFlowMatching
from nemo_vfm.models.common.lora import LoRAConfig, apply_lora, lora_state_dict
from nemo_vfm.models.ltx2 import convert as C
from nemo_vfm.models.ltx2.flavors import ltx2_config
from tests.inference.test_comfyui_lora import comfyui_apply, comfyui_key_map, comfyui_load_lora, lora_run

RELEASE = "model.diffusion_model."  # the release file's prefix of the transformer (ComfyUI strips it on load)


def _lora_run(tmp_path, cfg, lora):
    return lora_run(tmp_path, cfg, lora, AudioVideoFlowMatching())


def test_comfyui_export_loads_fully_and_equals_the_merged_release_export(tmp_path):
    from nemo_vfm_recipes.ltx2 import LTX2_LORA_TARGETS

    cfg, lora = ltx2_config("tiny"), LoRAConfig(rank=3, alpha=6.0, targets=LTX2_LORA_TARGETS)
    run, base, adapted = _lora_run(tmp_path, cfg, lora)
    out = tmp_path / "comfy.safetensors"
    assert main(["export", "--ckpt", str(run), "--format", "comfyui", "--out", str(out)]) == 0
    assert main(["export", "--ckpt", str(run), "--format", "original", "--out", str(tmp_path / "orig")]) == 0
    merged = {k.removeprefix(RELEASE): v for k, v in
              load_file(str(tmp_path / "orig" / "diffusion_pytorch_model.safetensors")).items()}
    lora_file = load_file(str(out))
    for key in ("transformer_blocks.0.attn1.to_q", "transformer_blocks.1.video_to_audio_attn.to_out.0",
                "transformer_blocks.0.audio_ff.net.0.proj"):
        assert f"diffusion_model.{key}.lora_A.weight" in lora_file, key
    patches, left = comfyui_load_lora(lora_file, comfyui_key_map(merged))
    assert not left and len(patches) == len(adapted) == 2 * 28
    patched = comfyui_apply(base, patches)
    assert set(patched) == set(merged)
    for k, w in merged.items():
        assert (patched[k] - w.float()).abs().max() <= 1e-6, k
    assert max((merged[k] - base[k]).abs().max().item() for k in merged) > 1e-2


def test_published_size_maps_every_linear_and_errors_name_the_layer():
    from nemo_vfm.models.ltx2.comfy_lora import comfyui_lora_state

    cfg = ltx2_config("ltx2_19b", num_layers=2)
    net = cfg.build("meta")
    adapted = apply_lora(net, LoRAConfig(rank=8, alpha=8.0, targets=("*",)))
    state = comfyui_lora_state(lora_state_dict(net), cfg, 8, 8.0, torch.bfloat16)
    patches, left = comfyui_load_lora(state, comfyui_key_map(cfg.build("meta").state_dict()))
    assert not left and len(patches) == len(adapted)
    with pytest.raises(ValueError, match="attn1.to_qq is not a weight"):
        comfyui_lora_state({"transformer_blocks.0.attn1.to_qq.lora_A.weight": torch.zeros(8, 4096),
                            "transformer_blocks.0.attn1.to_qq.lora_B.weight": torch.zeros(4096, 8)}, cfg, 8, 8.0)


def test_diffusers_lora_export_loads_in_diffusers_and_generate_is_refused(tmp_path, capsys):
    """``--format lora``: diffusers' LTX2VideoTransformer3DModel with the adapters reproduces our merged network;
    ``vfm generate`` says it does not sample an LTX-2 training run and what to do instead."""
    pytest.importorskip("diffusers")
    from diffusers import LTX2VideoTransformer3DModel

    from nemo_vfm.inference.checkpoint import load_checkpoint
    from nemo_vfm_recipes.ltx2 import LTX2_LORA_TARGETS
    from tests.models.ltx2.test_ltx2 import diffusers_forward, inputs

    cfg = ltx2_config("tiny")
    run, base, _ = _lora_run(tmp_path, cfg, LoRAConfig(rank=3, alpha=6.0, targets=LTX2_LORA_TARGETS))
    assert main(["export", "--ckpt", str(run), "--format", "lora", "--out", str(tmp_path / "l.safetensors")]) == 0
    lora = load_file(str(tmp_path / "l.safetensors"))
    assert "transformer.transformer_blocks.0.attn1.to_q.lora_A.weight" in lora
    C.save_weights(base, tmp_path / "base", cfg)
    ref = LTX2VideoTransformer3DModel.from_pretrained(str(tmp_path / "base")).eval()
    ref.load_lora_adapter(lora, adapter_name="ours")
    net = load_checkpoint(run).net.eval()  # the LoRA merged into the base
    x, audio, t, ctx, actx, mask = inputs(cfg)
    with torch.no_grad():
        v, a = net(x, t, ctx, mask, audio=audio, audio_context=actx, audio_context_mask=mask)
        rv, ra = diffusers_forward(ref, net, x, audio, t, ctx, actx, mask)
    assert (v - rv).abs().max() <= 1e-4 * rv.abs().max() and (a - ra).abs().max() <= 1e-4 * ra.abs().max()
    assert main(["generate", "--ckpt", str(run), "--prompt", "a cat"]) == 2
    assert "records no model.pretrained" in capsys.readouterr().err  # a run samples with its pipeline folder's parts
