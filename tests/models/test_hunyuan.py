"""HunyuanVideo 1.5: forward parity with diffusers' HunyuanVideo15Transformer3DModel (T2V, I2V, glyph tokens, mean
flow), the converters both ways, the published flavors on the meta device, and input errors."""

import pytest
import torch

from nemo_vfm.models.hunyuan import convert as C
from nemo_vfm.models.hunyuan.model import HunyuanVideoConfig

diffusers = pytest.importorskip("diffusers")


def tiny(**kw) -> HunyuanVideoConfig:
    base = dict(num_layers=2, hidden_size=32, num_heads=2, num_refiner_layers=2, in_channels=9, out_channels=4,
                text_dim=24, glyph_dim=12, image_dim=20, rope_axes_dim=(4, 6, 6))
    return HunyuanVideoConfig(**{**base, **kw})


def randomized(cfg, seed=0):
    torch.manual_seed(seed)
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return net.eval()


def diffusers_model(cfg, state):
    from diffusers import HunyuanVideo15Transformer3DModel

    ref = HunyuanVideo15Transformer3DModel(**C.config_to_diffusers(cfg)).eval()
    missing, unexpected = ref.load_state_dict(C.to_diffusers(state), strict=True)
    assert not missing and not unexpected
    return ref


def inputs(cfg, B=2, T=3, H=4, W=6, L=7, L2=5, n_img=6, i2v=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, cfg.out_channels, T, H, W, generator=g)
    t = torch.rand(B, generator=g)
    ctx = torch.randn(B, L, cfg.text_dim, generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, 4:] = False
    glyph = torch.randn(B, L2, cfg.glyph_dim, generator=g)
    gmask = torch.zeros(B, L2, dtype=torch.bool)
    gmask[1, :3] = True  # sample 0 has no quoted text
    cond = torch.zeros(B, cfg.cond_channels, T, H, W)
    img = torch.zeros(B, n_img, cfg.image_dim)
    if i2v:
        cond[:, : cfg.out_channels, 0] = torch.randn(B, cfg.out_channels, H, W, generator=g)
        cond[:, -1, 0] = 1.0
        img = torch.randn(B, n_img, cfg.image_dim, generator=g)
    return x, t, ctx, mask, glyph, gmask, cond, img


def diffusers_forward(ref, x, t, ctx, mask, glyph, gmask, cond, img, t_r=None):
    with torch.no_grad():
        return ref(hidden_states=torch.cat([x, cond], 1), timestep=t * 1000, encoder_hidden_states=ctx,
                   encoder_attention_mask=mask.long(), encoder_hidden_states_2=glyph,
                   encoder_attention_mask_2=gmask.long(), image_embeds=img,
                   timestep_r=None if t_r is None else t_r * 1000, return_dict=False)[0]


@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v"])
def test_forward_matches_diffusers(i2v):
    cfg = tiny()
    net = randomized(cfg)
    ref = diffusers_model(cfg, net.state_dict())
    x, t, ctx, mask, glyph, gmask, cond, img = inputs(cfg, i2v=i2v)
    want = diffusers_forward(ref, x, t, ctx, mask, glyph, gmask, cond, img)
    with torch.no_grad():
        got = net(x, t, ctx, mask, cond_latents=cond, image_embeds=img, glyph_context=glyph, glyph_mask=gmask)
        if not i2v:  # T2V without any image or condition input: the same
            plain = net(x, t, ctx, mask, glyph_context=glyph, glyph_mask=gmask)
            assert (plain - want).abs().max() <= 1e-5
    assert got.shape == x.shape
    assert (got - want).abs().max() <= 1e-5 * max(1.0, want.abs().max().item())


def test_meanflow_and_patches_match_diffusers():
    cfg = tiny(use_meanflow=True, patch_size=(1, 2, 2))
    net = randomized(cfg, seed=3)
    ref = diffusers_model(cfg, net.state_dict())
    x, t, ctx, mask, glyph, gmask, cond, img = inputs(cfg, i2v=True)
    t_r = t * 0.5
    want = diffusers_forward(ref, x, t, ctx, mask, glyph, gmask, cond, img, t_r)
    with torch.no_grad():
        got = net(x, t, ctx, mask, cond_latents=cond, image_embeds=img, glyph_context=glyph, glyph_mask=gmask,
                  timesteps_r=t_r)
    assert (got - want).abs().max() <= 1e-5 * max(1.0, want.abs().max().item())


def test_a_diffusers_folder_with_another_mlp_ratio_loads_and_matches(tmp_path):
    """diffusers builds its token refiner with MLPs of 4 x hidden whatever the transformer's ``mlp_ratio``: a folder
    saved by diffusers with ``mlp_ratio=3`` loads into our model (refiner 128 wide, blocks 96) and matches it."""
    from diffusers import HunyuanVideo15Transformer3DModel

    cfg = tiny(mlp_ratio=3.0)
    torch.manual_seed(5)
    ref = HunyuanVideo15Transformer3DModel(**C.config_to_diffusers(cfg)).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    refiner_ff = ref.context_embedder.token_refiner.refiner_blocks[0].ff.net[0].proj
    assert refiner_ff.out_features == 4 * cfg.hidden_size and cfg.mlp_size == 3 * cfg.hidden_size
    ref.save_pretrained(tmp_path / "hv")
    assert C.read_config(tmp_path / "hv") == cfg
    net = HunyuanVideoConfig(**{**vars(cfg), "pretrained": str(tmp_path / "hv")}).build().eval()
    x, t, ctx, mask, glyph, gmask, cond, img = inputs(cfg, i2v=True)
    want = diffusers_forward(ref, x, t, ctx, mask, glyph, gmask, cond, img)
    with torch.no_grad():
        got = net(x, t, ctx, mask, cond_latents=cond, image_embeds=img, glyph_context=glyph, glyph_mask=gmask)
    assert (got - want).abs().max() <= 1e-5 * max(1.0, want.abs().max().item())
    assert C.to_diffusers(net.state_dict()).keys() == ref.state_dict().keys()


def test_converters_round_trip_and_folders(tmp_path):
    cfg = tiny()
    state = randomized(cfg).state_dict()
    diff = C.to_diffusers(state)
    assert "context_embedder.token_refiner.refiner_blocks.1.attn.to_k.weight" in diff
    back = C.from_diffusers(diff)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)
    for layout in ("diffusers", "original"):
        folder = C.save_weights(state, tmp_path / layout, cfg, layout=layout)
        assert C.is_hunyuan_folder(folder)
        assert C.read_config(folder) == cfg
        net = HunyuanVideoConfig(**{**vars(cfg), "pretrained": str(folder)}).build()
        assert all(torch.equal(net.state_dict()[k], state[k]) for k in state)
    with pytest.raises(KeyError, match="not a HunyuanVideoModel parameter"):
        C.to_diffusers({"blocks.0.x": torch.zeros(1)})


def test_published_flavors_build_on_meta():
    from nemo_vfm.models.hunyuan.flavors import FLAVORS, hunyuan_config

    for name in FLAVORS:
        net = hunyuan_config(name).build("meta")
        if name != "tiny":
            assert 8.2e9 < net.num_params() < 8.5e9, (name, net.num_params())
    assert hunyuan_config("480p_i2v_step_distilled").use_meanflow
    with pytest.raises(ValueError, match="unknown HunyuanVideo flavor"):
        hunyuan_config("1080p")


def test_input_errors_name_the_fix():
    cfg = tiny()
    net = cfg.build()
    x, t, ctx, mask, *_ = inputs(cfg)
    with pytest.raises(ValueError, match="needs text"):
        net(x, t)
    with pytest.raises(ValueError, match="expected 4 latent channels"):
        net(x[:, :3], t, ctx, mask)
    with pytest.raises(ValueError, match="use_meanflow=False"):
        net(x, t, ctx, mask, timesteps_r=t)
    with pytest.raises(ValueError, match="rope_axes_dim"):
        tiny(rope_axes_dim=(4, 4, 4))
