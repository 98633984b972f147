"""ST-DiT: shapes, factorized attention = masked full attention, packed = unpacked, adaLN-Zero start, configs."""

import pytest
import torch
import torch.nn.functional as F

from nemo_vfm.data.batch import TokenSample, patchify
from nemo_vfm.data.packing import pack_samples
from nemo_vfm.models.stdit.flavors import FLAVORS, stdit_config
from nemo_vfm.models.stdit.model import FactorizedCore, STDiTConfig

PATCH = (1, 2, 2)


def tiny(**kw):
    return stdit_config("tiny", **{"in_channels": 4, "context_dim": 16, **kw})


def randomize(net):
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return net


def inputs(B=2, T=3, H=4, W=6, L=5, C=4):
    cond = {"context": torch.randn(B, L, 16), "context_mask": torch.ones(B, L, dtype=torch.bool),
            "fps": torch.full((B,), 24.0)}
    return torch.randn(B, C, T, H, W), torch.rand(B), cond


@pytest.mark.parametrize("kw", [dict(), dict(adaln_lora_rank=3, mlp="swiglu"), dict(pos_embed="sincos3d"),
                                dict(full_attn_every=0, context_dim=None, pos_embed="none"),
                                dict(fps_embed=True, rope_base_fps=24.0, learned_sigma=True, num_classes=10)])
def test_shapes_video_and_image(kw):
    torch.manual_seed(0)
    net = randomize(tiny(**kw).build())
    for T in (3, 1):
        x, t, cond = inputs(T=T)
        if net.cfg.context_dim is None:
            cond = {"fps": cond["fps"]}
        labels = torch.tensor([1, 10]) if net.cfg.num_classes else None
        out = net(x, t, class_labels=labels, **cond)
        assert out.shape == (2, net.cfg.out_channels, T, 4, 6) and torch.isfinite(out).all()


@pytest.mark.parametrize("axis", ["spatial", "temporal"])
def test_factorized_core_equals_masked_full_attention(axis):
    torch.manual_seed(0)
    t, hw = 3, 5
    q, k, v = (torch.randn(2, 4, t * hw, 8) for _ in range(3))
    frame, loc = torch.arange(t * hw) // hw, torch.arange(t * hw) % hw
    key = frame if axis == "spatial" else loc
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=key[:, None] == key[None, :])
    torch.testing.assert_close(FactorizedCore(axis)(q, k, v, hw), ref, atol=1e-5, rtol=1e-5)


def test_adaln_zero_start_is_identity_and_output_zero():
    net = tiny(adaln_lora_rank=3).build()
    x, t, cond = inputs()
    tokens = torch.randn(2, 3 * 2 * 3, 64)
    c, shared = net.condition(t, fps=cond["fps"])
    for block in net.blocks:
        assert torch.equal(block(tokens, c, 6, None, cond["context"], cond["context_mask"], shared), tokens)
    assert net(x, t, **cond).abs().max() == 0


def test_meta_build_then_init_weights():
    a = tiny().build()
    b = tiny().build("meta").to_empty(device="cpu")
    b.init_weights()
    assert [(n, p.shape) for n, p in a.named_parameters()] == [(n, p.shape) for n, p in b.named_parameters()]
    assert all(torch.isfinite(p).all() for p in b.parameters())
    assert all(blk.adaln.linear.weight.abs().max() == 0 for blk in b.blocks)
    assert b.patch_embed.proj.weight.std() > 0


def test_block_has_full_attention_where_configured():
    net = STDiTConfig(num_layers=4, hidden_size=32, num_heads=2, in_channels=4, full_attn_every=2).build("meta")
    assert [b.has_full for b in net.blocks] == [False, True, False, True]
    assert len(net.blocks[1].adaln.linear.weight) == 15 * 32  # 5 sub-layers x (shift, scale, gate)


def _samples(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, shape in enumerate([(4, 3, 4, 6), (4, 1, 4, 4), (4, 2, 2, 6)]):
        lat = torch.randn(shape, generator=g)
        text = torch.randn(2 + i, 16, generator=g)
        tokens, pos = patchify(lat, PATCH)
        out.append((lat, text, TokenSample(key=f"s{i}", tokens=tokens, pos_ids=pos, loss_mask=torch.ones(len(tokens)),
                                           text=text, latent_shape=shape, patch_size=PATCH, fps=8.0 + i,
                                           num_real_tokens=len(tokens))))
    return out


@pytest.mark.parametrize("pad", [1, 8])
def test_packed_forward_equals_unpacked(pad):
    torch.manual_seed(0)
    net = randomize(tiny(pos_embed="rope3d", rope_base_fps=8.0, fps_embed=True).build())
    data = _samples()
    batch = pack_samples([s for _, _, s in data], pad_to_multiple=pad)
    t = torch.tensor([0.1, 0.5, 0.9])
    with torch.no_grad():
        out = net(batch.tokens, t, context=batch.text, fps=batch.fps, packed=batch)
        for g, (lat, text, _) in enumerate(data):
            ref = net(lat[None], t[g:g + 1], context=text[None], context_mask=torch.ones(1, len(text), dtype=torch.bool),
                      fps=batch.fps[g:g + 1])[0]
            a = int(batch.cu_seqlens[g])
            want, _ = patchify(ref, PATCH)
            torch.testing.assert_close(out[a:a + int(batch.seq_lens[g])], want, atol=1e-5, rtol=1e-5)


def test_flavors_and_errors():
    assert FLAVORS["xl"] == dict(num_layers=28, hidden_size=1152, num_heads=16, ffn_size=4608)
    assert stdit_config("ST-DiT-XL-wide").hidden_size == 1536 and stdit_config("3b").num_layers == 24
    with pytest.raises(ValueError, match="unknown ST-DiT flavor"):
        stdit_config("huge")
    with pytest.raises(ValueError, match="pos_embed"):
        STDiTConfig(pos_embed="sincos2d")
    with pytest.raises(ValueError, match="divisible by num_heads"):
        STDiTConfig(hidden_size=100, num_heads=16)
    with pytest.raises(ValueError, match="full_attn_every"):
        STDiTConfig(full_attn_every=-1)
    net = tiny().build()
    x, t, cond = inputs()
    with pytest.raises(ValueError, match="pass context"):
        net(x, t)


def test_layout_check_names_the_problem():
    from nemo_vfm.models.stdit.family import check_layout
    from nemo_vfm.parallel.dims import ParallelDims

    cfg = tiny()
    with pytest.raises(ValueError, match="frames"):
        check_layout(cfg, ParallelDims(world_size=2, cp=2), (3, 4, 4))
    with pytest.raises(ValueError, match="tokens per frame"):
        check_layout(cfg, ParallelDims(world_size=4, cp=4), (4, 4, 6))
    check_layout(cfg, ParallelDims(world_size=4, cp=4), (4, 4, 6), factorized_context_parallel="ring")
    with pytest.raises(NotImplementedError, match="pipeline"):
        check_layout(cfg, ParallelDims(world_size=2, pp=2))


def test_recipes_build_serialize_and_train_two_steps(tmp_path):
    import fiddle as fdl
    from nemo_run.core.serialization.yaml import YamlSerializer

    from nemo_vfm_recipes import stdit

    for name in ("pretrain_stdit_xl", "pretrain_stdit_xl_wide", "pretrain_stdit_3b"):
        recipe = getattr(stdit, name)()
        assert "model:" in YamlSerializer().serialize(recipe)
        fdl.build(recipe.model).build("meta")
    r = stdit.pretrain_stdit_xl()
    r.model.num_layers, r.model.hidden_size, r.model.num_heads, r.model.ffn_size = 2, 32, 2, 32
    r.model.context_dim = r.data.context_dim = 16
    r.model.full_attn_every = 2
    r.data.context_length, r.data.num_frames, r.data.height, r.data.width, r.data.num_samples = 4, 2, 4, 4, 4
    r.trainer.max_steps, r.trainer.accelerator, r.trainer.devices, r.trainer.enable_progress_bar = 2, "cpu", 1, False
    r.log.root, r.log.tensorboard = str(tmp_path), False
    summary = fdl.build(r)()
    assert summary["step"] == 2 and summary["loss"] is not None
