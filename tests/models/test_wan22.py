"""Wan 2.2: the TI2V-5B shape with per-token timesteps, the CLIP-free I2V-A14B shape and two-expert folders, each
against diffusers' WanTransformer3DModel with the same random weights; flavors, configs and converters."""

import dataclasses
import json

import pytest
import torch

from nemo_vfm.models.wan import convert as C
from nemo_vfm.models.wan.model import WanConfig

diffusers = pytest.importorskip("diffusers")


def tiny_5b(**kw) -> WanConfig:  # the TI2V-5B layout (48 channels in and out, patch 1x2x2), tiny widths
    return WanConfig(**{**dict(num_layers=2, hidden_size=48, num_heads=2, ffn_size=64, in_channels=48,
                               out_channels=48, context_dim=16, freq_dim=32, text_len=16), **kw})


def tiny_i2v_a14b(**kw) -> WanConfig:  # the I2V-A14B layout (16 + 20 channels in, no CLIP tokens)
    return WanConfig(**{**dict(num_layers=2, hidden_size=48, num_heads=2, ffn_size=64, in_channels=36,
                               out_channels=16, context_dim=16, freq_dim=32, text_len=16), **kw})


def randomized(cfg: WanConfig, seed: int = 0):
    torch.manual_seed(seed)
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return net.eval()


def reference(cfg: WanConfig, state: dict):
    ref = diffusers.WanTransformer3DModel(**C.config_to_diffusers(cfg)).eval()
    missing, unexpected = ref.load_state_dict(C.to_diffusers(state), strict=True)
    assert not missing and not unexpected
    return ref


def padded(cfg, ctx):
    out = torch.zeros(ctx.shape[0], cfg.text_len, ctx.shape[2])
    out[:, : ctx.shape[1]] = ctx
    return out


@pytest.mark.parametrize("per_token", [False, True], ids=["t_B", "t_BS"])
def test_ti2v_5b_shape_matches_diffusers_loaded_through_our_converter(tmp_path, per_token):
    """Random weights saved in diffusers' layout, loaded by our converter: the forward equals diffusers' for
    (B,) timesteps and for per-token (B, S) timesteps with the first frame's tokens at t = 0."""
    from nemo_vfm.diffusion.first_frame import token_times

    cfg = tiny_5b()
    C.save_weights(randomized(cfg).state_dict(), tmp_path, cfg, layout="diffusers")
    ours = C.load_pretrained(tmp_path).eval()
    ref = diffusers.WanTransformer3DModel.from_pretrained(tmp_path).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 48, 3, 4, 6, generator=g)
    ctx = torch.randn(2, 5, 16, generator=g)
    t = torch.tensor([0.9, 0.3])
    if per_token:
        t = token_times(t, torch.tensor([True, False]), x.shape, cfg.patch_size)
        assert t.shape == (2, 3 * 2 * 3) and t[0, :6].eq(0).all() and t[0, 6:].eq(0.9).all() and t[1].eq(0.3).all()
    with torch.no_grad():
        a = ours(x, t, ctx)
        b = ref(x, t * 1000, padded(ours.cfg, ctx), return_dict=False)[0]
    assert a.shape == (2, 48, 3, 4, 6)
    assert (a - b).abs().max().item() <= 1e-5
    if per_token:  # the clean first frame changes the output: the per-token times reach the network
        with torch.no_grad():
            assert (ours(x, t[:, :1].expand_as(t).contiguous(), ctx) - a).abs().max() > 1e-3
    with pytest.raises(ValueError, match="per-token timesteps"):
        ours(x, torch.zeros(2, 7), ctx)


@pytest.mark.parametrize("layout", ["diffusers", "original"])
def test_i2v_a14b_two_expert_folder_loads_each_expert(tmp_path, layout):
    """A two-expert folder (diffusers: transformer/ + transformer_2/; the release: high_noise_model/ +
    low_noise_model/): each expert reads back as written, CLIP-free I2V, and equals diffusers' forward."""
    cfg = tiny_i2v_a14b()
    assert cfg.cond_channels == 20 and not cfg.is_i2v
    nets = {"high": randomized(cfg, 1), "low": randomized(cfg, 2)}
    for expert, net in nets.items():
        out = C.save_weights(net.state_dict(), tmp_path, dataclasses.replace(cfg, expert=expert), layout=layout)
        assert out.name == {"diffusers": {"high": "transformer", "low": "transformer_2"},
                            "original": {"high": "high_noise_model", "low": "low_noise_model"}}[layout][expert]
    if layout == "original":  # the release's configs carry no image_dim: the missing img_emb weights say "no CLIP"
        for sub in ("high_noise_model", "low_noise_model"):
            c = json.loads((tmp_path / sub / "config.json").read_text())
            assert c["model_type"] == "i2v"
            c.pop("image_dim")
            (tmp_path / sub / "config.json").write_text(json.dumps(c))
    assert C.is_wan_folder(tmp_path)
    with pytest.raises(ValueError, match="two Wan 2.2 experts"):
        C.read_config(tmp_path)
    g = torch.Generator().manual_seed(3)
    x, cond = torch.randn(1, 16, 2, 4, 4, generator=g), torch.randn(1, 20, 2, 4, 4, generator=g)
    ctx = torch.randn(1, 4, 16, generator=g)
    for expert, net in nets.items():
        got = C.read_config(tmp_path, expert)
        assert got.expert == expert and got.image_dim is None and got.cond_channels == 20
        loaded = C.load_pretrained(tmp_path, expert=expert).eval()
        for k, v in net.state_dict().items():
            assert torch.equal(loaded.state_dict()[k], v), k
        ref = reference(cfg, net.state_dict())
        with torch.no_grad():
            a = loaded(x, torch.tensor([0.5]), ctx, cond_latents=cond)
            b = ref(torch.cat([x, cond], 1), torch.tensor([500.0]), padded(loaded.cfg, ctx), return_dict=False)[0]
        assert (a - b).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="cond_latents"):
        loaded(x, torch.tensor([0.5]), ctx)


def test_meta_build_with_expert_loads_that_expert(tmp_path):
    """The training path (a recipe's model.pretrained + model.expert): meta build, init_weights, that expert."""
    cfg = tiny_5b(num_layers=1)
    states = {e: randomized(cfg, i).state_dict() for i, e in enumerate(("high", "low"))}
    for e, s in states.items():
        C.save_weights(s, tmp_path, dataclasses.replace(cfg, expert=e))
    net = dataclasses.replace(cfg, pretrained=str(tmp_path), expert="low").build("meta").to_empty(device="cpu")
    net.init_weights()
    for k, v in net.state_dict().items():
        assert torch.equal(v, states["low"][k]), k
    with pytest.raises(ValueError, match="model.expert"):
        dataclasses.replace(cfg, pretrained=str(tmp_path)).build()
    with pytest.raises(ValueError, match="expert"):
        dataclasses.replace(cfg, expert="middle")


def test_flavors_configs_and_round_trips():
    from nemo_vfm.models.wan.flavors import FLAVORS, SAMPLING, flavor_of, wan_config

    five = wan_config("wan2.2-ti2v-5b")
    assert (five.hidden_size, five.num_layers, five.num_heads, five.ffn_size, five.in_channels) == (3072, 30, 24, 14336, 48)
    assert 4.9e9 < five.build("meta").num_params() < 5.1e9
    a14 = wan_config("t2v_a14b")
    assert flavor_of(a14) == "t2v_14b" and flavor_of(a14, two_experts=True) == "t2v_a14b"
    assert flavor_of(wan_config("i2v_a14b"), two_experts=True) == "i2v_a14b" and flavor_of(five) == "ti2v_5b"
    assert SAMPLING["t2v_a14b"]["boundary"] == 0.875 and SAMPLING["i2v_a14b"]["boundary"] == 0.9
    for name in ("ti2v_5b", "t2v_a14b", "i2v_a14b"):
        cfg = wan_config(name)
        assert C.config_from_json(C.config_to_diffusers(cfg)) == cfg
        assert C.config_from_json(C.config_to_original(cfg)) == cfg
        assert name in FLAVORS
    assert C.config_to_original(five)["model_type"] == "ti2v"
    d = C.config_to_diffusers(wan_config("i2v_a14b"))
    assert (d["in_channels"], d["image_dim"], d["added_kv_proj_dim"]) == (36, None, None)
    assert C.to_diffusers(randomized(tiny_5b(num_layers=1)).state_dict()).keys() == \
        diffusers.WanTransformer3DModel(**C.config_to_diffusers(tiny_5b(num_layers=1))).state_dict().keys()


def test_wan21_state_dict_keys_unchanged():
    """Checkpoints of Wan 2.1 models keep their keys: the modules are the same (norms moved to their own file)."""
    from nemo_vfm.models.wan.flavors import wan_config

    keys = set(wan_config("i2v_14b_480p", num_layers=1).build("meta").state_dict())
    assert {"img_emb.proj.0.weight", "blocks.0.cross_attn.k_img.weight", "blocks.0.self_attn.norm_q.weight",
            "blocks.0.norm3.weight", "head.modulation", "time_projection.1.weight"} <= keys
    assert len(keys) == len(set(wan_config("i2v_14b_480p", num_layers=1).build("meta").state_dict()))
