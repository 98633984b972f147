"""Load the published DiT checkpoints (facebookresearch/DiT, e.g. ``DiT-XL-2-256x256.pt``).

Their key layout differs from ours only in naming and in the fused ``qkv`` projection and the
``Conv2d`` patch embedding; :func:`convert_original_state_dict` maps one to the other. Sampling then
uses :class:`nemo_vfm.diffusion.edm.DDPMPrecond` (the network predicts epsilon on the 1000-step linear
DDPM schedule) with our Heun/Euler solvers; latents are SD-VAE latents (4 channels, scale 0.18215).

    from nemo_vfm.models.dit.original import load_original_dit
    net = load_original_dit("DiT-XL-2-256x256.pt")            # the flavor is read from the weights
    objective = DDPMPrecond()
    labels = torch.tensor([207, 360]); null = torch.full_like(labels, 1000)
    z = objective.sample(net, (2, 4, 1, 32, 32), {"class_labels": labels}, {"class_labels": null}, guidance=4.0)
    # decode z / 0.18215 with diffusers' AutoencoderKL("stabilityai/sd-vae-ft-ema") from a local folder
"""

import re
from pathlib import Path

import torch

from nemo_vfm.models.dit.flavors import FLAVORS, original_dit_config
from nemo_vfm.models.dit.model import DiT

_RENAMES = [
    (r"^t_embedder\.mlp\.", "t_embedder.mlp."),
    (r"^y_embedder\.embedding_table\.", "y_embedder.embedding_table."),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"blocks.\1.attn.proj."),
    (r"^blocks\.(\d+)\.mlp\.fc(\d)\.", r"blocks.\1.mlp.fc\2."),
    (r"^blocks\.(\d+)\.adaLN_modulation\.1\.", r"blocks.\1.adaln.linear."),
    (r"^final_layer\.linear\.", "final_layer.linear."),
    (r"^final_layer\.adaLN_modulation\.1\.", "final_layer.adaln."),
]


def convert_original_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Published DiT state dict -> :class:`DiT` state dict (``pos_embed`` is dropped: we compute it)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if key == "pos_embed":
            continue
        if key == "x_embedder.proj.weight":  # Conv2d (D, C, p, p) -> Linear over (pt=1 ph pw C) patches
            out["patch_embed.proj.weight"] = value.permute(0, 2, 3, 1).flatten(1)
            continue
        if key == "x_embedder.proj.bias":
            out["patch_embed.proj.bias"] = value
            continue
        m = re.match(r"^blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", key)
        if m:
            q, k, v = value.chunk(3, dim=0)
            for name, part in zip("qkv", (q, k, v)):
                out[f"blocks.{m.group(1)}.attn.{name}.{m.group(2)}"] = part
            continue
        for pattern, repl in _RENAMES:
            if re.match(pattern, key):
                out[re.sub(pattern, repl, key)] = value
                break
        else:
            raise KeyError(f"unexpected key {key!r} in a DiT checkpoint")
    return out


def infer_config(sd: dict[str, torch.Tensor]):
    """The :class:`DiTConfig` of a published state dict, from its shapes (heads from the flavor's width)."""
    hidden = sd["x_embedder.proj.weight"].shape[0]
    flavor = next((n for n in ("s", "b", "l", "xl") if FLAVORS[n]["hidden_size"] == hidden), None)
    if flavor is None:
        raise ValueError(f"no DiT-S/B/L/XL flavor has hidden size {hidden}")
    patch = sd["x_embedder.proj.weight"].shape[-1]
    return original_dit_config(flavor, num_layers=1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks.")),
                               num_classes=sd["y_embedder.embedding_table.weight"].shape[0] - 1,
                               patch_size=(1, patch, patch))


def load_original_dit(path: str | Path, device: str | torch.device = "cpu") -> DiT:
    """Build a :class:`DiT` with the published weights at ``path`` (a ``.pt`` state dict)."""
    sd = torch.load(path, map_location="cpu", weights_only=True)
    if "model" in sd and isinstance(sd["model"], dict):  # training checkpoints of the DiT repo
        sd = sd.get("ema", sd["model"])
    net = infer_config(sd).build()
    net.load_state_dict(convert_original_state_dict(sd), strict=True)
    return net.to(device).eval()


def original_state_dict_from(net: DiT) -> dict[str, torch.Tensor]:
    """The inverse of :func:`convert_original_state_dict` (export to the published layout, ``pos_embed``
    included), e.g. to hand weights back to the original DiT code."""

    sd, out = net.state_dict(), {}
    p = net.cfg.patch_size[1]
    w = sd["patch_embed.proj.weight"]
    out["x_embedder.proj.weight"] = w.unflatten(1, (p, p, net.cfg.in_channels)).permute(0, 3, 1, 2).contiguous()
    out["x_embedder.proj.bias"] = sd["patch_embed.proj.bias"]
    for i in range(net.cfg.num_layers):
        for kind in ("weight", "bias"):
            out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([sd[f"blocks.{i}.attn.{n}.{kind}"] for n in "qkv"])
    inverse = [(r"^patch_embed\.", None), (r"^blocks\.(\d+)\.attn\.[qkv]\.", None),
               (r"^blocks\.(\d+)\.adaln\.linear\.", r"blocks.\1.adaLN_modulation.1."),
               (r"^final_layer\.adaln\.", "final_layer.adaLN_modulation.1.")]
    for key, value in sd.items():
        for pattern, repl in inverse:
            if re.match(pattern, key):
                if repl is not None:
                    out[re.sub(pattern, repl, key)] = value
                break
        else:
            out[key] = value
    return out
