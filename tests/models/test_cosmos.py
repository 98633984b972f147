"""Cosmos-Predict2.5: forward parity with diffusers' CosmosTransformer3DModel (scalar and per-frame times, text
mask, padding mask), converters both ways (diffusers, original release), saved folders, flavors on meta, a
flow-matching step's gradients."""


import pytest
import torch

from nemo_vfm.models.cosmos import convert as C
from nemo_vfm.models.cosmos.flavors import FLAVORS, cosmos_config, flavor_of
from nemo_vfm.models.cosmos.model import CosmosConfig
from nemo_vfm.parallel.config import PARALLELIZE_KNOBS

diffusers = pytest.importorskip("diffusers")


def nearest_resize_shim():
    """torchvision is not installed here; diffusers' Cosmos transformer resizes its padding mask with
    ``transforms.functional.resize(NEAREST)``, which on tensors is ``F.interpolate(mode="nearest")``."""
    import types

    import torch.nn.functional as F
    from diffusers.models.transformers import transformer_cosmos as tc

    if not hasattr(tc, "transforms"):
        resize = lambda x, size, interpolation=None: F.interpolate(x, size=size, mode="nearest")  # noqa: E731
        tc.transforms = types.SimpleNamespace(functional=types.SimpleNamespace(resize=resize),
                                              InterpolationMode=types.SimpleNamespace(NEAREST="nearest"))


nearest_resize_shim()


def tiny(**kw) -> CosmosConfig:
    return CosmosConfig(**{**FLAVORS["tiny"], **kw})


def randomized(cfg: CosmosConfig, seed: int = 0):
    torch.manual_seed(seed)
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return net.eval()


def diffusers_model(cfg: CosmosConfig, state: dict):
    from diffusers import CosmosTransformer3DModel

    ref = CosmosTransformer3DModel(**C.config_to_diffusers(cfg)).eval()
    ref.load_state_dict(C.to_diffusers(state), strict=True)
    return ref


def inputs(cfg, B=2, T=3, H=4, W=6, L=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, cfg.in_channels, T, H, W, generator=g)
    t = torch.rand(B, generator=g)
    ctx = torch.randn(B, L, cfg.context_dim, generator=g)
    return x, t, ctx


def theirs(ref, x, t, ctx, cond_mask=None, padding_mask=None):
    B, _, T, H, W = x.shape
    cond = torch.zeros(B, 1, T, H, W) if cond_mask is None else cond_mask
    pad = torch.zeros(1, 1, H, W) if padding_mask is None else padding_mask
    return ref(x, t, ctx, condition_mask=cond, padding_mask=pad, return_dict=False)[0]


def test_forward_matches_diffusers_through_converter():
    cfg = tiny()
    net = randomized(cfg)
    ref = diffusers_model(cfg, net.state_dict())
    x, t, ctx = inputs(cfg)
    with torch.no_grad():
        ours = net(x, t, ctx)
        assert ours.shape == x.shape
        assert (ours - theirs(ref, x, t, ctx)).abs().max().item() <= 1e-5
        # the other direction: diffusers' weights -> ours
        back = cfg.build("meta")
        back.load_state_dict(C.from_diffusers(ref.state_dict()), assign=True)
        assert (back(x, t, ctx) - ours).abs().max().item() == 0


def test_video2world_inputs_match_diffusers():
    """Per-frame times (clean conditioning frames at a tiny t), the condition mask, a padding mask, and a text mask
    (ours zeroes the masked text states and attends to every position, as the pipeline feeds diffusers' model)."""
    cfg = tiny()
    net = randomized(cfg, 2)
    ref = diffusers_model(cfg, net.state_dict())
    x, t, ctx = inputs(cfg, seed=3)
    B, _, T, H, W = x.shape
    ind = torch.zeros(B, 1, T, 1, 1)
    ind[:, :, :2] = 1
    t5 = ind * 1e-4 + (1 - ind) * t.view(B, 1, 1, 1, 1)  # diffusers' (B, 1, T, 1, 1)
    cond = ind.expand(B, 1, T, H, W)
    pad = torch.zeros(1, 1, 16, 24)
    pad[..., -8:] = 1
    mask = torch.ones(B, ctx.shape[1], dtype=torch.bool)
    mask[0, 5:] = False
    per_token = t5[:, 0, :, 0, 0].repeat_interleave((H // 2) * (W // 2), dim=1)  # (B, S)
    with torch.no_grad():
        ours = net(x, per_token, ctx, mask, cond_mask=cond, padding_mask=pad)
        ref_out = theirs(ref, x, t5, ctx * mask[..., None], cond, pad)  # zeroed text, all positions attended
    assert (ours - ref_out).abs().max().item() <= 1e-5


def test_saved_folders_load_both_ways(tmp_path):
    cfg = tiny()
    net = randomized(cfg, 4)
    state = net.state_dict()
    C.save_weights(state, tmp_path / "w", cfg, max_shard_bytes=100_000)
    assert (tmp_path / "w" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    from diffusers import CosmosTransformer3DModel

    ref = CosmosTransformer3DModel.from_pretrained(tmp_path / "w").eval()
    ref.save_pretrained(tmp_path / "pipe" / "transformer")
    assert C.is_cosmos_folder(tmp_path / "pipe") and not C.is_cosmos_folder(tmp_path)
    loaded = C.load_pretrained(tmp_path / "pipe")
    assert loaded.cfg == C.read_config(tmp_path / "pipe", pretrained=str(tmp_path / "pipe"))
    built = C.read_config(tmp_path / "w", pretrained=str(tmp_path / "w")).build()
    x, t, ctx = inputs(cfg, seed=5)
    with torch.no_grad():
        want = theirs(ref, x, t, ctx)
        assert (loaded(x, t, ctx) - want).abs().max().item() <= 1e-5
        assert (built(x, t, ctx) - want).abs().max().item() <= 1e-5


def test_converters_round_trip_and_configs():
    cfg = tiny()
    state = randomized(cfg).state_dict()
    d = C.to_diffusers(state)
    assert len(d) == len(state) and all(C.from_diffusers(d)[k] is v for k, v in state.items())
    for want in ("patch_embed.proj.weight", "time_embed.t_embedder.linear_1.weight", "time_embed.norm.weight",
                 "crossattn_proj.0.bias", "transformer_blocks.1.attn2.to_out.0.weight",
                 "transformer_blocks.0.norm2.linear_2.weight", "transformer_blocks.0.ff.net.0.proj.weight",
                 "norm_out.linear_1.weight", "proj_out.weight", "transformer_blocks.0.attn1.norm_k.weight"):
        assert want in d
    orig = C.to_original(state)
    assert "net.blocks.0.adaln_modulation_cross_attn.1.weight" in orig
    orig["net.accum_iteration"] = torch.tensor(3)
    orig["net.blocks.0.self_attn.q_proj._extra_state"] = None
    assert C.from_original(orig).keys() == state.keys()
    assert C.config_from_json(C.config_to_diffusers(cfg)) == cfg
    with pytest.raises(ValueError, match="not the Predict2.5 architecture"):
        C.config_from_json({**C.config_to_diffusers(cfg), "extra_pos_embed_type": "learnable"})


def test_published_flavors_on_meta_match_diffusers_configs():
    """The 2B / 14B configs are diffusers' Cosmos-2.5-Predict-Base-2B / -14B (parameter counts from the meta build)."""
    from diffusers import CosmosTransformer3DModel

    for name, layers, heads in (("predict2_5_2b", 28, 16), ("predict2_5_14b", 36, 40)):
        cfg = cosmos_config(name)
        assert flavor_of(cfg) == name
        c = C.config_to_diffusers(cfg)
        assert (c["in_channels"], c["num_layers"], c["num_attention_heads"], c["attention_head_dim"]) == (17, layers, heads, 128)
        assert c["rope_scale"] == [1.0, 3.0, 3.0] and c["crossattn_proj_in_channels"] == 100352
        with torch.device("meta"):
            ref = CosmosTransformer3DModel(**c)
        ours = cfg.build("meta")
        assert ours.num_params() == sum(p.numel() for p in ref.parameters())
    assert cosmos_config("2b").num_layers == 28
    with pytest.raises(ValueError, match="unknown Cosmos flavor"):
        cosmos_config("7b")


def test_bad_inputs_raise():
    net = tiny().build()
    x, t, ctx = inputs(net.cfg)
    with pytest.raises(ValueError, match="latent channels"):
        net(x[:, :2], t, ctx)
    with pytest.raises(ValueError, match="per-token timesteps"):
        net(x, t[:, None].expand(2, 5), ctx)
    with pytest.raises(ValueError, match="needs text"):
        net(x, t)
    with pytest.raises(ValueError, match="divisible by the patch size"):
        net(x[..., :5], t, ctx)


def test_training_step_gradients_reach_every_parameter():
    from nemo_vfm.diffusion.flow_matching import FlowMatching

    net = randomized(tiny()).train()
    x, _, ctx = inputs(net.cfg)
    loss, _ = FlowMatching().training_loss(net, x, {"context": ctx}, generator=torch.Generator().manual_seed(0))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())


def test_declared_spec_flops_equal_the_measured_forward():
    """The family's FLOP count equals FlopCounterMode's on a real forward (distinct times per sample); the spec's
    TP plan, token split and knobs fit the block and the parallelize function."""
    import inspect

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from nemo_vfm.models.families import family_spec
    from nemo_vfm.parallel.tensor_parallel import check_tp_plan

    cfg = tiny()
    spec = family_spec(cfg)
    assert spec.name == "cosmos"
    net = randomized(cfg)
    x, t, ctx = inputs(cfg, T=3, H=8, W=4)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, -2:] = False
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        net(x, t, ctx, mask)
    counts = {str(op): n for op, n in fc.get_flop_counts()["Global"].items()}
    attention = counts.pop("aten.bmm", 0) + counts.pop("aten.baddbmm", 0)
    got = spec.flops(cfg, [24, 24], [7, 7], [(3, 4, 2)] * 2)
    assert (got.linear, got.attention) == (sum(counts.values()), attention)
    check_tp_plan(net.blocks, spec.tp_plan, optional=spec.tp_optional)
    assert set(spec.token_split.names()) <= inspect.signature(net.blocks[0].forward).parameters.keys()
    assert spec.knobs <= set(PARALLELIZE_KNOBS)
    with pytest.raises(ValueError, match="text_lens"):
        spec.flops(cfg, [24])


def test_a_dropped_prompt_is_zero_text_not_nan():
    """CFG training drops prompts to an all-False mask: the network sees zero text states, not a fully masked
    attention row."""
    net = randomized(tiny())
    x, t, ctx = inputs(net.cfg)
    with torch.no_grad():
        dropped = net(x, t, ctx, torch.zeros(2, ctx.shape[1], dtype=torch.bool))
        assert torch.isfinite(dropped).all()
        assert torch.equal(dropped, net(x, t, torch.zeros_like(ctx)))
