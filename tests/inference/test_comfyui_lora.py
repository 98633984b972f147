"""``vfm export --format comfyui``: a Wan LoRA file that ComfyUI's LoraLoader loads fully and exactly.

ComfyUI is not installed here, so its LoRA path for a Wan model is re-implemented below from its code
(``comfy/lora.py`` ``model_lora_keys_unet`` and ``load_lora``, ``comfy/weight_adapter/lora.py`` ``LoRAAdapter``),
on the names of the original model's weights (those our ``--format original`` export writes). Every key of the
file must be read (ComfyUI logs the others as "lora key not loaded" and drops them), and the patched original
weights must equal our merged export.
"""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from nemo_vfm.cli.main import main
from nemo_vfm.models.common.lora import LoRAConfig, apply_lora, lora_state_dict
from nemo_vfm.models.wan import convert as C
from nemo_vfm.models.wan.flavors import FLAVORS
from nemo_vfm.models.wan.model import WanConfig

WAN_TARGETS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.o", "cross_attn.q", "cross_attn.k",
               "cross_attn.v", "cross_attn.o", "ffn.0", "ffn.2")
TINY = dict(num_layers=2, hidden_size=48, num_heads=2, ffn_size=64, out_channels=4, context_dim=16, freq_dim=32,
            text_len=16)


# -- ComfyUI's LoRA path for a Wan model, re-implemented (LoRA adapters only) ---------------------------------
def comfyui_key_map(original_keys) -> dict[str, str]:
    """``model_lora_keys_unet`` for a Wan model: its weights are ``diffusion_model.<original name>``; a weight is
    reachable as ``diffusion_model.<name>`` and kohya's ``lora_unet_<name, dots as _>`` (Wan has no diffusers map)."""
    key_map = {}
    for k in original_keys:
        k = "diffusion_model." + k
        if k.endswith(".weight"):
            name = k[len("diffusion_model.") : -len(".weight")]
            key_map["lora_unet_" + name.replace(".", "_")] = k
            key_map[k[: -len(".weight")]] = k
        else:
            key_map[k] = k
    return key_map


def comfyui_load_lora(lora: dict, key_map: dict) -> tuple[dict, set]:
    """``load_lora`` + ``LoRAAdapter.load``: {model weight: (up, down, alpha)} and the keys left unread."""
    patches, loaded = {}, set()
    for x, target in key_map.items():
        alpha = None
        if f"{x}.alpha" in lora:
            alpha = lora[f"{x}.alpha"].item()
            loaded.add(f"{x}.alpha")
        for up, down in ((".lora_up.weight", ".lora_down.weight"), (".lora_B.weight", ".lora_A.weight")):
            if x + up in lora:
                patches[target] = (lora[x + up], lora[x + down], alpha)
                loaded |= {x + up, x + down}
                break
    return patches, set(lora) - loaded


def comfyui_apply(weights: dict, patches: dict, strength: float = 1.0) -> dict:
    """``LoRAAdapter.calculate_weight``: ``W + strength * (alpha / rank or 1.0) * up @ down`` (fp32)."""
    out = dict(weights)
    for key, (up, down, alpha) in patches.items():
        name = key[len("diffusion_model.") :]
        scale = alpha / down.shape[0] if alpha is not None else 1.0
        w = out[name].float()
        out[name] = w + (strength * scale) * torch.mm(up.float().flatten(1), down.float().flatten(1)).reshape(w.shape)
    return out


# -- a tiny Wan LoRA run, saved as train() does ------------------------------------------------------------------
def lora_run(tmp_path, cfg, lora: LoRAConfig, objective=None):
    """A LoRA run's checkpoint, saved as train() does (random base and adapters; ``objective``: Wan's by default);
    returns the run folder, the base weights and the adapted layers."""
    from nemo_vfm.models.wan.flavors import wan_objective

    torch.manual_seed(0)
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    base = {k: v.clone() for k, v in net.state_dict().items()}
    adapted = apply_lora(net, lora)
    with torch.no_grad():
        for n, p in net.named_parameters():
            if ".lora_" in n:
                p.copy_(0.2 * torch.randn_like(p))
    path = tmp_path / "run" / "checkpoints" / "step=00000003.ckpt"
    path.parent.mkdir(parents=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in net.state_dict().items()}, "global_step": 3,
                "hyper_parameters": {"model_config": cfg, "objective": objective or wan_objective("tiny"),
                                     "lora": lora}}, path)
    return tmp_path / "run", base, adapted


CASES = {
    "t2v": (WanConfig(in_channels=4, **TINY), LoRAConfig(rank=4, alpha=12.0, targets=WAN_TARGETS)),
    # every linear, I2V's included: cross_attn.k_img / v_img, img_emb.proj.*, text/time embeddings, head.head
    "i2v_every_linear": (WanConfig(in_channels=12, image_dim=8, **TINY), LoRAConfig(rank=3, alpha=2.0, targets=("*",))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_comfyui_export_loads_fully_and_equals_the_merged_original_export(tmp_path, case):
    cfg, lora = CASES[case]
    run, base, adapted = lora_run(tmp_path, cfg, lora)
    out = tmp_path / "comfy.safetensors"
    assert main(["export", "--ckpt", str(run), "--format", "comfyui", "--out", str(out)]) == 0
    assert main(["export", "--ckpt", str(run), "--format", "original", "--out", str(tmp_path / "orig")]) == 0
    merged = load_file(str(tmp_path / "orig" / "diffusion_pytorch_model.safetensors"))  # original names, LoRA merged
    lora_file = load_file(str(out))
    with safe_open(str(out), "pt") as f:
        meta = json.loads(f.metadata()["nemo_vfm_lora"])
    assert meta["rank"] == lora.rank and meta["alpha"] == lora.alpha and meta["layout"] == "comfyui"

    assert "diffusion_model.blocks.0.self_attn.q.lora_A.weight" in lora_file
    assert "diffusion_model.blocks.1.ffn.2.lora_B.weight" in lora_file
    assert lora_file["diffusion_model.blocks.0.self_attn.q.alpha"].item() == lora.alpha
    if cfg.image_dim is not None:
        assert "diffusion_model.blocks.0.cross_attn.k_img.lora_A.weight" in lora_file
        assert "diffusion_model.img_emb.proj.1.lora_B.weight" in lora_file
        assert "diffusion_model.head.head.lora_A.weight" in lora_file

    patches, left = comfyui_load_lora(lora_file, comfyui_key_map(merged))
    assert not left  # no "lora key not loaded"
    assert len(patches) == len(adapted) and len(lora_file) == 3 * len(adapted)

    patched = comfyui_apply(C.to_original(base), patches)  # the user's original weights + the LoRA, as ComfyUI does
    assert set(patched) == set(merged)
    for k, w in merged.items():
        assert (patched[k] - w.float()).abs().max() <= 1e-6, k
    moved = max((merged[k] - base[k]).abs().max().item() for k in merged)
    assert moved > 1e-2  # the adapters change the weights: the comparison is not vacuous


def test_the_diffusers_layout_file_is_what_comfyui_skipped(tmp_path):
    """The issue: ComfyUI reads none of the ``--format lora`` keys for Wan; the comfyui file is read whole."""
    cfg, lora = CASES["t2v"]
    run, base, _ = lora_run(tmp_path, cfg, lora)
    assert main(["export", "--ckpt", str(run), "--format", "lora", "--out", str(tmp_path / "d.safetensors")]) == 0
    diffusers_file = load_file(str(tmp_path / "d.safetensors"))
    patches, left = comfyui_load_lora(diffusers_file, comfyui_key_map(C.to_original(base)))
    assert not patches and left == set(diffusers_file) and len(left) == 2 * 2 * len(WAN_TARGETS)


@pytest.mark.parametrize("flavor", [f for f in FLAVORS if f != "tiny"])
def test_published_sizes_map_every_linear(flavor):
    """Every published Wan size, built on the meta device: every linear a user can target gets a key ComfyUI reads."""
    from nemo_vfm.models.wan.comfy_lora import comfyui_lora_state
    from nemo_vfm.models.wan.flavors import wan_config

    cfg = wan_config(flavor)
    net = cfg.build("meta")
    adapted = apply_lora(net, LoRAConfig(rank=8, alpha=8.0, targets=("*",)))
    state = comfyui_lora_state(lora_state_dict(net), cfg, 8, 8.0, torch.bfloat16)
    patches, left = comfyui_load_lora(state, comfyui_key_map(C.to_original(cfg.build("meta").state_dict())))
    assert not left and len(patches) == len(adapted)
    assert state["diffusion_model.blocks.0.self_attn.q.alpha"].dtype == torch.float32  # alpha stays exact
    assert state["diffusion_model.blocks.0.self_attn.q.lora_A.weight"].dtype == torch.bfloat16


def test_comfyui_errors(tmp_path, capsys):
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.inference.export import export
    from nemo_vfm.models.dit.model import DiTConfig
    from nemo_vfm.models.wan.comfy_lora import comfyui_lora_state

    dit = DiTConfig(num_layers=1, hidden_size=32, num_heads=4, in_channels=12, context_dim=8)
    net = dit.build()
    lora = LoRAConfig(rank=2)
    apply_lora(net, lora)
    path = tmp_path / "dit" / "step=00000001.ckpt"
    path.parent.mkdir()
    torch.save({"state_dict": {f"model.{k}": v for k, v in net.state_dict().items()}, "global_step": 1,
                "hyper_parameters": {"model_config": dit, "objective": EDM(), "lora": lora}}, path)
    assert main(["export", "--ckpt", str(path), "--format", "comfyui", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "DiTConfig has no ComfyUI LoRA layout" in err and "--format lora" in err and "--format safetensors" in err
    assert not (tmp_path / "x").exists()

    wan = WanConfig(in_channels=4, **TINY)
    plain = tmp_path / "wan" / "step=00000001.ckpt"
    plain.parent.mkdir()
    torch.save({"state_dict": {f"model.{k}": v for k, v in wan.build().state_dict().items()}, "global_step": 1,
                "hyper_parameters": {"model_config": wan, "objective": EDM()}}, plain)
    with pytest.raises(ValueError, match="not a LoRA run"):
        export(plain, "comfyui", tmp_path / "y.safetensors")
    a = torch.zeros(4, 48)
    with pytest.raises(ValueError, match="do not fit rank 2"):
        comfyui_lora_state({"blocks.0.self_attn.q.lora_A.weight": a, "blocks.0.self_attn.q.lora_B.weight":
                            torch.zeros(48, 4)}, wan, 2, 2.0)
    with pytest.raises(ValueError, match="lack lora_A or lora_B"):
        comfyui_lora_state({"blocks.0.self_attn.q.lora_A.weight": a}, wan, 4, 4.0)


def test_a_distilled_lora_student_exports_its_own_adapters_for_comfyui(tmp_path):
    """A DMD2 run with LoRA (student and critic adapters on frozen bases, a frozen teacher): ``--format comfyui``
    writes the student's adapters (not the critic's), ComfyUI reads every key, and the patched weights are the
    student's merged export."""
    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.diffusion.flow_matching import FlowMatching
    from nemo_vfm.lightning.distill_module import DistillConfig
    from nemo_vfm.lightning.module import OptimConfig
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    cfg, lora = WanConfig(in_channels=4, **TINY), LoRAConfig(rank=4, alpha=8.0, targets=WAN_TARGETS)
    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16, context_length=5,
                                batch_size=2, num_samples=8)
    torch.manual_seed(0)
    teacher = cfg.build()
    with torch.no_grad():  # a teacher whose output layer is not zero (Wan's initialisation zeroes it)
        for p in teacher.parameters():
            p.add_(0.1 * torch.randn_like(p))
    init = tmp_path / "teacher" / "step=00000001.ckpt"
    init.parent.mkdir()
    torch.save({"state_dict": {f"model.{k}": v for k, v in teacher.state_dict().items()}, "global_step": 1,
                "hyper_parameters": {"model_config": cfg, "objective": FlowMatching(shift=3.0)}}, init)
    summary = train(model=cfg, data=data, objective=FlowMatching(shift=3.0), lora=lora, ema_decay=None, init_from=str(init),
                    optim=OptimConfig(lr=1e-2, warmup_steps=0), distill=DistillConfig(num_steps=2, generator_update_every=1),
                    trainer=TrainerConfig(max_steps=2, accelerator="cpu", devices=1, precision="32-true",
                                          enable_progress_bar=False),
                    log=ExperimentConfig(name="student", root=str(tmp_path), tensorboard=False))
    state = torch.load(summary["checkpoint"], map_location="cpu", weights_only=False)["state_dict"]
    student = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    critic = {k[len("critic."):]: v for k, v in state.items() if k.startswith("critic.")}
    a = "blocks.0.self_attn.q.lora_B.weight"
    assert not torch.equal(student[a], critic[a])  # two trained sets of adapters
    out = tmp_path / "comfy.safetensors"
    run = tmp_path / "student"
    assert main(["export", "--ckpt", str(run), "--format", "comfyui", "--out", str(out)]) == 0
    assert main(["export", "--ckpt", str(run), "--format", "original", "--out", str(tmp_path / "orig")]) == 0
    merged = load_file(str(tmp_path / "orig" / "diffusion_pytorch_model.safetensors"))
    lora_file = load_file(str(out))
    patches, left = comfyui_load_lora(lora_file, comfyui_key_map(merged))
    assert not left and patches
    assert torch.equal(lora_file["diffusion_model.blocks.0.self_attn.q.lora_B.weight"], student[a])
    base = {k: v for k, v in student.items() if ".lora_" not in k}
    base = {k.replace(".base.", "."): v for k, v in base.items()}
    patched = comfyui_apply(C.to_original(base), patches)
    for k, w in merged.items():
        assert (patched[k] - w.float()).abs().max() <= 1e-5, k
