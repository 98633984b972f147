import pytest
import torch

from nemo_vfm.models.common.adaln import AdaLNModulation
from nemo_vfm.models.common.embeddings import (
    PatchEmbed3D,
    RoPE3D,
    apply_rope,
    sincos_pos_embed_2d,
    unpatchify,
)
from nemo_vfm.models.dit.flavors import FLAVORS, dit_config
from nemo_vfm.models.dit.model import DiTConfig

torch.manual_seed(0)


def tiny(**kw):
    return dit_config("tiny", **{"in_channels": 4, "context_dim": 32, **kw})


def inputs(cfg, B=2, T=3, H=8, W=8, L=5):
    x = torch.randn(B, cfg.in_channels, T, H, W)
    cond = {"context": torch.randn(B, L, 32), "context_mask": torch.ones(B, L, dtype=torch.bool),
            "fps": torch.full((B,), 24.0)}
    return x, torch.rand(B), cond


def randomize(net):
    """Give the zero-initialised (adaLN-Zero) parameters values so that blocks actually compute."""
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return net


@pytest.mark.parametrize("kw", [dict(), dict(adaln_lora_rank=8), dict(mlp="swiglu", pos_embed="sincos3d"),
                                dict(patch_size=(1, 2, 2), rope_base_fps=24.0, fps_embed=True),
                                dict(qk_norm=False, pos_embed="none")])
def test_shapes_video_and_image(kw):
    cfg = tiny(**kw)
    net = cfg.build()
    for T in (3, 1):  # a video and an image (T = 1)
        x, t, cond = inputs(cfg, T=T if cfg.patch_size[0] == 1 else 2)
        out = net(x, t, **cond)
        assert out.shape == x.shape


def test_patchify_unpatchify_roundtrip():
    pe = PatchEmbed3D(4, 16, (2, 2, 4))
    x = torch.randn(2, 4, 4, 6, 8)
    tokens = pe.patchify(x)
    assert tokens.shape == (2, 2 * 3 * 2, 2 * 2 * 4 * 4)
    assert torch.equal(unpatchify(tokens, (2, 3, 2), (2, 2, 4), 4), x)


def test_indivisible_patch_is_a_clear_error():
    net = tiny(patch_size=(1, 4, 4)).build()
    x, t, cond = inputs(net.cfg, H=6)
    with pytest.raises(ValueError, match="not divisible by patch size"):
        net(x, t, **cond)


def test_adaln_zero_starts_as_identity_and_output_is_zero():
    net = tiny().build()
    x, t, cond = inputs(net.cfg)
    tokens = torch.randn(2, 10, 64)
    c = torch.randn(2, 64)
    for block in net.blocks:
        assert torch.equal(block(tokens, c, None, cond["context"], cond["context_mask"]), tokens)
    assert torch.count_nonzero(net(x, t, **cond)) == 0  # zero-initialised final layer


def test_adaln_lora_param_saving_on_7b():
    full = dit_config("7b", in_channels=16, context_dim=4096, adaln_lora_rank=0).build("meta")
    lora = dit_config("7b", in_channels=16, context_dim=4096).build("meta")
    d, layers, r = 4096, 28, FLAVORS["7b"]["adaln_lora_rank"]
    saved = full.num_params() - lora.num_params()
    expected = layers * (9 * d * d + 9 * d - (d * r + r * 9 * d)) - 3 * d * d - 3 * d
    assert saved == expected
    assert saved > 3.5e9  # 11.8B -> 7.9B parameters
    assert lora.num_params() < 0.7 * full.num_params()


def test_adaln_lora_adds_shared_chunkwise():
    mod = AdaLNModulation(8, 9, lora_rank=2)
    torch.nn.init.normal_(mod.up.weight)
    c, shared = torch.randn(3, 8), torch.randn(3, 24)
    chunks = mod(c, shared)
    low_rank = mod.up(mod.down(torch.nn.functional.silu(c)))[:, None]
    for i, ch in enumerate(chunks):
        assert torch.allclose(ch, low_rank[..., i * 8:(i + 1) * 8] + shared[:, None, (i % 3) * 8:(i % 3 + 1) * 8])


def test_rope_is_relative():
    rope = RoPE3D(24)
    q, k = torch.randn(1, 1, 1, 24), torch.randn(1, 1, 1, 24)

    def score(p, s):
        cq, sq = rope((1, 1, 1), offset=p)
        ck, sk = rope((1, 1, 1), offset=s)
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum()

    assert torch.allclose(score((2, 3, 1), (1, 1, 4)), score((5, 7, 2), (4, 5, 5)), atol=1e-5)
    assert not torch.allclose(score((2, 3, 1), (1, 1, 4)), score((2, 3, 1), (1, 2, 4)), atol=1e-3)


def test_rope_fps_scaling_aligns_seconds():
    rope = RoPE3D(24, base_fps=24.0)
    c24, _ = rope((4, 1, 1), fps=torch.tensor([24.0]))
    c12, _ = rope((4, 1, 1), fps=torch.tensor([12.0]))
    assert torch.allclose(c12[0, 1], c24[0, 2], atol=1e-6)  # frame 1 at 12 fps == frame 2 at 24 fps


def test_sincos2d_matches_published_dit_convention():
    import numpy as np

    def reference(d, n):  # the MAE/DiT numpy construction, written out independently
        gh, gw = np.arange(n, dtype=np.float32), np.arange(n, dtype=np.float32)
        grid = np.stack(np.meshgrid(gw, gh), 0).reshape(2, 1, n, n)

        def one(dim, pos):
            omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
            out = np.einsum("m,d->md", pos.reshape(-1), omega)
            return np.concatenate([np.sin(out), np.cos(out)], 1)

        return np.concatenate([one(d // 2, grid[0]), one(d // 2, grid[1])], 1)

    ours = sincos_pos_embed_2d(64, (1, 4, 4))
    assert torch.allclose(ours, torch.from_numpy(reference(64, 4)).float(), atol=1e-6)


def test_padding_tokens_do_not_change_cross_attention():
    net = randomize(tiny().build())
    x, t, cond = inputs(net.cfg, L=4)
    padded = dict(cond, context=torch.cat([cond["context"], torch.randn(2, 3, 32)], 1),
                  context_mask=torch.cat([cond["context_mask"], torch.zeros(2, 3, dtype=torch.bool)], 1))
    assert torch.allclose(net(x, t, **cond), net(x, t, **padded), atol=1e-5)
    empty = dict(cond, context=torch.zeros(2, 4, 32), context_mask=torch.zeros(2, 4, dtype=torch.bool))
    assert torch.isfinite(net(x, t, **empty)).all()


def test_meta_build_then_init_matches_eager_build():
    cfg = tiny(adaln_lora_rank=4)
    net = cfg.build("meta")
    net.to_empty(device="cpu")
    torch.manual_seed(1)
    net.init_weights()
    torch.manual_seed(1)
    ref = cfg.build()  # build_dit initialises in the same order
    torch.manual_seed(1)
    ref.init_weights()
    for (n, a), (_, b) in zip(net.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("bad, match", [
    (dict(hidden_size=65), "divisible by num_heads"), (dict(mlp="relu"), "mlp must be"),
    (dict(pos_embed="alibi"), "pos_embed must be one of"), (dict(patch_size=(1, 2)), "patch_size"),
])
def test_config_errors_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        DiTConfig(**{**dict(num_layers=2, hidden_size=64, num_heads=4), **bad})


def test_flavor_sizes():
    for name, (layers, hidden, heads) in {"s": (12, 384, 6), "b": (12, 768, 12), "l": (24, 1024, 16),
                                          "xl": (28, 1152, 16), "7b": (28, 4096, 32), "14b": (36, 5120, 40),
                                          "28b": (48, 6144, 48)}.items():
        cfg = dit_config(name)
        assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads) == (layers, hidden, heads)
    with pytest.raises(ValueError, match="unknown DiT flavor"):
        dit_config("xxl")
