import torch

from nemo_vfm.diffusion.edm import DDPMPrecond
from nemo_vfm.models.dit.flavors import original_dit_config
from nemo_vfm.models.dit.original import (
    convert_original_state_dict,
    load_original_dit,
    original_state_dict_from,
)


def published_layout_keys(layers: int) -> set[str]:
    """The key set of facebookresearch/DiT's ``DiT`` state dict (from its module names)."""
    keys = {"pos_embed", "x_embedder.proj.weight", "x_embedder.proj.bias", "y_embedder.embedding_table.weight",
            "final_layer.linear.weight", "final_layer.linear.bias", "final_layer.adaLN_modulation.1.weight",
            "final_layer.adaLN_modulation.1.bias"}
    keys |= {f"t_embedder.mlp.{i}.{k}" for i in (0, 2) for k in ("weight", "bias")}
    for b in range(layers):
        for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "adaLN_modulation.1"):
            keys |= {f"blocks.{b}.{m}.weight", f"blocks.{b}.{m}.bias"}
    return keys


def test_roundtrip_through_published_layout(tmp_path):
    cfg = original_dit_config("s", num_layers=2, num_classes=1000)
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    published = original_state_dict_from(net)
    published["pos_embed"] = torch.zeros(1, 256, cfg.hidden_size)
    assert set(published) == published_layout_keys(2)
    assert published["x_embedder.proj.weight"].shape == (384, 4, 2, 2)
    assert published["blocks.0.attn.qkv.weight"].shape == (3 * 384, 384)
    assert published["y_embedder.embedding_table.weight"].shape == (1001, 384)

    torch.save(published, tmp_path / "DiT-S-2-tiny.pt")
    loaded = load_original_dit(tmp_path / "DiT-S-2-tiny.pt")
    converted = convert_original_state_dict(published)
    fresh = cfg.build()
    fresh.load_state_dict(converted, strict=True)
    x, t, y = torch.randn(2, 4, 1, 8, 8), torch.tensor([10.0, 500.0]), torch.tensor([3, 1000])
    assert torch.equal(fresh(x, t, class_labels=y), net(x, t, class_labels=y))
    assert torch.equal(loaded(x, t, class_labels=y), net(x, t, class_labels=y))


def test_patch_embedding_conversion_matches_conv2d():
    net = original_dit_config("s", num_layers=1).build()
    published = original_state_dict_from(net)
    conv = torch.nn.Conv2d(4, 384, 2, 2)
    conv.weight.data, conv.bias.data = published["x_embedder.proj.weight"], published["x_embedder.proj.bias"]
    x = torch.randn(1, 4, 1, 8, 8)
    ours = net.patch_embed(x)  # (1, 16, 384)
    ref = conv(x[:, :, 0]).flatten(2).transpose(1, 2)  # the original's PatchEmbed
    assert torch.allclose(ours, ref, atol=1e-5)


def test_sampling_pipeline_with_ddpm_preconditioning():
    net = original_dit_config("s", num_layers=1).build()
    y = torch.tensor([1, 2])
    z = DDPMPrecond().sample(net, (2, 4, 1, 8, 8), {"class_labels": y}, {"class_labels": torch.full_like(y, 1000)},
                             guidance=4.0, num_steps=3)
    assert z.shape == (2, 4, 1, 8, 8) and torch.isfinite(z).all()
