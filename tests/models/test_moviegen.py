"""MovieGen: shapes, GQA, learnable factorized positions, packed = unpacked, adaLN-Zero start, flavors, configs."""

import pytest
import torch
import torch.nn.functional as F

from nemo_vfm.data.batch import TokenSample, patchify
from nemo_vfm.data.packing import pack_samples
from nemo_vfm.models.moviegen.flavors import FLAVORS, moviegen_config
from nemo_vfm.models.moviegen.model import GQAttention, MovieGenConfig

PATCH = (1, 2, 2)


def tiny(**kw):
    return moviegen_config("tiny", **{"in_channels": 4, "context_dim": 16, **kw})


def randomize(net):
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return net


def inputs(B=2, T=3, H=4, W=6, L=5):
    cond = {"context": torch.randn(B, L, 16), "context_mask": torch.ones(B, L, dtype=torch.bool)}
    cond["context_mask"][0, 3:] = False
    return torch.randn(B, 4, T, H, W), torch.rand(B), cond


@pytest.mark.parametrize("kw", [dict(), dict(num_kv_heads=1), dict(num_kv_heads=4, qk_norm=False),
                                dict(context_dim=None, fps_embed=True, learned_sigma=True)])
def test_shapes_video_and_image(kw):
    torch.manual_seed(0)
    net = randomize(tiny(**kw).build())
    for T in (3, 1):
        x, t, cond = inputs(T=T)
        if net.cfg.context_dim is None:
            cond = {"fps": torch.full((2,), 24.0)}
        out = net(x, t, **cond)
        assert out.shape == (2, net.cfg.out_channels, T, 4, 6) and torch.isfinite(out).all()


def test_gqa_equals_multihead_with_shared_kv_heads():
    torch.manual_seed(0)
    attn = GQAttention(32, num_heads=4, num_kv_heads=2, qk_norm=False)
    attn.init_weights()
    x = torch.randn(2, 7, 32)
    q = attn.q(x).view(2, 7, 4, 8).transpose(1, 2)
    k = attn.k(x).view(2, 7, 2, 8).transpose(1, 2)
    v = attn.v(x).view(2, 7, 2, 8).transpose(1, 2)
    heads = [F.scaled_dot_product_attention(q[:, i], k[:, i // 2], v[:, i // 2]) for i in range(4)]
    want = attn.proj(torch.stack(heads, 1).transpose(1, 2).flatten(2))
    torch.testing.assert_close(attn(x), want, atol=1e-5, rtol=1e-5)
    assert attn.k.weight.shape == (16, 32)


def test_positions_are_factorized_and_learnable():
    net = tiny().build()
    emb = net.grid_positions((2, 3, 4))
    assert emb.shape == (24, 64)
    torch.testing.assert_close(emb.view(2, 3, 4, 64)[1, 2, 3], net.pos_t[1] + net.pos_h[2] + net.pos_w[3])
    with pytest.raises(ValueError, match="max_grid"):
        net.grid_positions((17, 1, 1))


def test_adaln_zero_start_is_identity_and_output_zero():
    net = tiny().build()
    x, t, cond = inputs()
    tokens = torch.randn(2, 18, 64)
    c, mod = net.condition(t)
    for block in net.blocks:
        assert torch.equal(block(tokens, mod, cond["context"], cond["context_mask"]), tokens)
    assert net(x, t, **cond).abs().max() == 0


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
    net = randomize(tiny().build())
    data = _samples()
    batch = pack_samples([s for _, _, s in data], pad_to_multiple=pad)
    t = torch.tensor([0.1, 0.5, 0.9])
    with torch.no_grad():
        out = net(batch.tokens, t, context=batch.text, packed=batch)
        for g, (lat, text, _) in enumerate(data):
            ref = net(lat[None], t[g:g + 1], context=text[None],
                      context_mask=torch.ones(1, len(text), dtype=torch.bool))[0]
            a = int(batch.cu_seqlens[g])
            want, _ = patchify(ref, PATCH)
            torch.testing.assert_close(out[a:a + int(batch.seq_lens[g])], want, atol=1e-5, rtol=1e-5)


def test_packed_training_loss_backward():
    from nemo_vfm.diffusion.edm import EDM
    from nemo_vfm.diffusion.packed import packed_training_loss

    net = tiny().build()
    batch = pack_samples([s for _, _, s in _samples()], pad_to_multiple=8)
    loss, _ = packed_training_loss(EDM(), net, batch, torch.Generator().manual_seed(0), cond_dropout=0.5)
    loss.backward()
    assert torch.isfinite(loss) and net.final_layer.linear.weight.grad.abs().sum() > 0


def test_flavors_and_errors():
    assert moviegen_config("30b").num_kv_heads == 48 and FLAVORS["30b"]["ffn_size"] == 16384  # the paper's shape
    assert moviegen_config("MovieGen-5B").num_layers == 32 and moviegen_config("1b").num_heads == 32
    assert moviegen_config("3b").num_kv_heads == 24
    with pytest.raises(ValueError, match="unknown MovieGen flavor"):
        moviegen_config("7b")
    with pytest.raises(ValueError, match="num_kv_heads"):
        MovieGenConfig(num_heads=32, num_kv_heads=5)
    with pytest.raises(ValueError, match="patch_size"):
        MovieGenConfig(patch_size=(1, 2))
    with pytest.raises(ValueError, match="pass context"):
        tiny().build()(*inputs()[:2])


def test_layout_check_names_the_problem():
    from nemo_vfm.models.moviegen.family import check_layout
    from nemo_vfm.parallel.dims import ParallelDims

    with pytest.raises(ValueError, match="num_kv_heads=8"):
        check_layout(moviegen_config("30b", num_kv_heads=8), ParallelDims(world_size=16, tp=16))
    check_layout(moviegen_config("30b"), ParallelDims(world_size=64, tp=8), (32, 32, 32))
    with pytest.raises(ValueError, match="pipeline stages"):
        check_layout(moviegen_config("tiny", num_layers=3), ParallelDims(world_size=2, pp=2))


def test_recipes_build_serialize_and_train_two_steps(tmp_path):
    import fiddle as fdl
    from nemo_run.core.serialization.yaml import YamlSerializer

    from nemo_vfm.diffusion.flow_matching import FlowMatching
    from nemo_vfm_recipes import moviegen

    for name in ("pretrain_moviegen_1b", "pretrain_moviegen_3b", "pretrain_moviegen_5b", "pretrain_moviegen_30b"):
        recipe = getattr(moviegen, name)()
        assert "model:" in YamlSerializer().serialize(recipe)
        fdl.build(recipe.model).build("meta")
    big = moviegen.pretrain_moviegen_30b()
    assert big.trainer.strategy.fsdp and big.trainer.strategy.activation_checkpointing == "full"
    r = moviegen.pretrain_moviegen_1b()
    assert isinstance(fdl.build(r.objective), FlowMatching)
    r.model.num_layers, r.model.hidden_size, r.model.num_heads, r.model.num_kv_heads, r.model.ffn_size = 1, 32, 2, 1, 32
    r.model.context_dim = r.data.context_dim = 16
    r.data.context_length, r.data.num_frames, r.data.height, r.data.width, r.data.num_samples = 4, 2, 4, 4, 4
    r.trainer.max_steps, r.trainer.accelerator, r.trainer.devices, r.trainer.enable_progress_bar = 2, "cpu", 1, False
    r.log.root, r.log.tensorboard = str(tmp_path), False
    summary = fdl.build(r)()
    assert summary["step"] == 2 and summary["loss"] is not None
