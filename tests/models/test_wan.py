"""Wan 2.1: forward parity with diffusers' WanTransformer3DModel (T2V and I2V, both weight layouts),
converters both ways, flavors on the meta device, a flow-matching step's loss and gradients."""

import json

import pytest
import torch

from nemo_vfm.models.wan import convert as C
from nemo_vfm.models.wan.model import WanConfig

diffusers = pytest.importorskip("diffusers")

TEXT_LEN = 512  # diffusers' I2V attention splits image/text tokens assuming 512 text tokens


def tiny(i2v: bool = False, **kw) -> WanConfig:
    base = dict(num_layers=2, hidden_size=48, num_heads=2, ffn_size=64, in_channels=4, out_channels=4,
                context_dim=16, freq_dim=32, text_len=TEXT_LEN)
    if i2v:
        base.update(in_channels=4 + 6, image_dim=20)
    return WanConfig(**{**base, **kw})


def randomized(cfg: WanConfig, seed: int = 0):
    torch.manual_seed(seed)
    net = cfg.build()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return net


def diffusers_model(cfg: WanConfig, state: dict):
    from diffusers import WanTransformer3DModel

    ref = WanTransformer3DModel(**C.config_to_diffusers(cfg)).eval()
    missing, unexpected = ref.load_state_dict(C.to_diffusers(state), strict=True)
    assert not missing and not unexpected
    return ref


def inputs(cfg: WanConfig, B=2, T=3, H=4, W=6, L=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, cfg.out_channels, T, H, W, generator=g)
    t = torch.rand(B, generator=g)
    ctx = torch.randn(B, L, cfg.context_dim, generator=g)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, 4:] = False
    extra = {}
    if cfg.is_i2v:
        extra = {"cond_latents": torch.randn(B, cfg.cond_channels, T, H, W, generator=g),
                 "image_embeds": torch.randn(B, cfg.image_len, cfg.image_dim, generator=g)}
    return x, t, ctx, mask, extra


def diffusers_forward(ref, cfg, x, t, ctx, mask, extra):
    """What diffusers' WanPipeline feeds the transformer: zeroed padding, text padded to 512, t * 1000."""
    padded = torch.zeros(ctx.shape[0], cfg.text_len, ctx.shape[2])
    padded[:, : ctx.shape[1]] = ctx * mask[..., None]
    if cfg.is_i2v:
        x = torch.cat([x, extra["cond_latents"]], 1)
    return ref(x, t * 1000, padded, encoder_hidden_states_image=extra.get("image_embeds"), return_dict=False)[0]


@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v"])
@pytest.mark.parametrize("layout", ["diffusers", "original"])
def test_forward_matches_diffusers_from_saved_weights(tmp_path, i2v, layout):
    cfg = tiny(i2v)
    net = randomized(cfg).eval()
    state = net.state_dict()
    # shard small so that the index path is exercised
    C.save_weights(state, tmp_path / "w", cfg, layout=layout, max_shard_bytes=200_000)
    files = list((tmp_path / "w").glob("*.safetensors"))
    assert len(files) > 1 and (tmp_path / "w" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    loaded = C.load_pretrained(tmp_path / "w").eval()
    assert loaded.cfg.is_i2v == i2v and loaded.cfg.num_layers == cfg.num_layers
    for k, v in state.items():
        torch.testing.assert_close(loaded.state_dict()[k], v, rtol=0, atol=0)
    if layout == "diffusers":
        from diffusers import WanTransformer3DModel

        ref = WanTransformer3DModel.from_pretrained(tmp_path / "w").eval()
    else:
        ref = diffusers_model(cfg, state)
    x, t, ctx, mask, extra = inputs(cfg)
    with torch.no_grad():
        ours = loaded(x, t, ctx, mask, **extra)
        theirs = diffusers_forward(ref, cfg, x, t, ctx, mask, extra)
    assert ours.shape == (2, cfg.out_channels, 3, 4, 6)
    assert (ours - theirs).abs().max().item() <= 1e-5


def test_diffusers_save_pretrained_folder_loads(tmp_path):
    """A folder written by diffusers itself (config + weights) reads back as the same network."""
    cfg = tiny(True)
    net = randomized(cfg, 3).eval()
    ref = diffusers_model(cfg, net.state_dict())
    ref.save_pretrained(tmp_path / "pipe" / "transformer", max_shard_size="100KB")
    assert C.is_wan_folder(tmp_path / "pipe")
    loaded = C.load_pretrained(tmp_path / "pipe")
    assert loaded.cfg == C.read_config(tmp_path / "pipe", pretrained=str(tmp_path / "pipe"))
    x, t, ctx, mask, extra = inputs(cfg, seed=5)
    with torch.no_grad():
        assert (loaded(x, t, ctx, mask, **extra) - diffusers_forward(ref, cfg, x, t, ctx, mask, extra)).abs().max() <= 1e-5


def test_converters_round_trip_and_configs():
    for i2v in (False, True):
        cfg = tiny(i2v)
        state = randomized(cfg).state_dict()
        d = C.to_diffusers(state)
        assert len(set(d)) == len(state)
        assert C.from_diffusers(d).keys() == state.keys()
        assert all(C.from_diffusers(d)[k] is v for k, v in state.items())
        assert C.from_original(C.to_original(state)).keys() == state.keys()
        assert C.config_from_json(C.config_to_diffusers(cfg), text_len=TEXT_LEN) == cfg
        assert C.config_from_json(C.config_to_original(cfg), image_dim=cfg.image_dim) == cfg
    names = set(C.to_diffusers(randomized(tiny(True)).state_dict()))
    for want in ("condition_embedder.time_embedder.linear_1.weight", "condition_embedder.time_proj.bias",
                 "blocks.1.attn1.to_out.0.weight", "blocks.0.attn2.add_k_proj.weight", "blocks.0.attn2.norm_added_k.weight",
                 "blocks.0.norm2.weight", "blocks.0.ffn.net.0.proj.weight", "blocks.0.scale_shift_table",
                 "scale_shift_table", "proj_out.weight", "condition_embedder.image_embedder.ff.net.2.weight"):
        assert want in names, want


def test_config_inferred_from_weights_without_config_json(tmp_path):
    cfg = tiny(False, num_heads=1, hidden_size=128, ffn_size=32)
    C.save_weights(randomized(cfg).state_dict(), tmp_path, cfg, layout="diffusers")
    (tmp_path / "config.json").unlink()
    got = C.read_config(tmp_path, text_len=TEXT_LEN)
    assert got == cfg


def test_wrong_config_is_refused(tmp_path):
    cfg = tiny(False)
    C.save_weights(randomized(cfg).state_dict(), tmp_path, cfg)
    with pytest.raises(ValueError, match="config does not match"):
        C.load_pretrained(tmp_path, config=tiny(False, ffn_size=32))
    with pytest.raises(ValueError, match="neither"):
        C.config_from_json({"foo": 1})
    net = tiny(True).build()
    x, t, ctx, mask, _ = inputs(tiny(True))
    with pytest.raises(ValueError, match="image-to-video"):
        net(x, t, ctx, mask)


def test_flow_matching_step_matches_diffusers_loss_and_grads():
    """One flow-matching step (Wan's objective: velocity n - x0 at t, time input 1000 t): same loss and
    gradients through our model and through diffusers' model with the same weights and draws."""
    from nemo_vfm.models.wan.flavors import wan_objective

    cfg = tiny(False)
    net = randomized(cfg, 7)
    ref = diffusers_model(cfg, net.state_dict())
    obj = wan_objective("t2v_1_3b")
    x0, _, ctx, mask, _ = inputs(cfg, seed=9)
    g = torch.Generator().manual_seed(3)
    loss, _ = obj.training_loss(net, x0, {"context": ctx, "context_mask": mask}, generator=g)
    loss.backward()
    # the same draws, by hand, through diffusers
    g = torch.Generator().manual_seed(3)
    t = obj.sample_time(x0.shape[0], g)
    noise = torch.randn(x0.shape, generator=g)
    xt = (1 - t.view(-1, 1, 1, 1, 1)) * x0 + t.view(-1, 1, 1, 1, 1) * noise
    v = diffusers_forward(ref, cfg, xt, t, ctx, mask, {})
    ref_loss = ((v - (noise - x0)) ** 2).mean()
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= 1e-6 * abs(ref_loss.item())
    theirs = {C.from_diffusers_name(n): p.grad for n, p in ref.named_parameters()}
    for n, p in net.named_parameters():
        assert torch.allclose(p.grad, theirs[n], atol=1e-6, rtol=1e-4), n


def test_flavors_parameter_counts_on_meta():
    from nemo_vfm.models.wan.flavors import FLAVORS, wan_config

    counts = {name: wan_config(name).build("meta").num_params() for name in FLAVORS if name != "tiny"}
    assert 1.3e9 < counts["t2v_1_3b"] < 1.45e9, counts  # published "1.3B": 1,418,996,800 with embeddings
    assert 13.5e9 < counts["t2v_14b"] < 14.5e9, counts
    assert counts["i2v_14b_480p"] == counts["i2v_14b_720p"] > counts["t2v_14b"]
    d = C.config_to_diffusers(wan_config("i2v_14b_720p"))
    assert (d["in_channels"], d["image_dim"], d["added_kv_proj_dim"], d["num_layers"]) == (36, 1280, 5120, 40)
    assert json.dumps(d)


def test_meta_build_then_init_weights_loads_pretrained(tmp_path):
    """The strategy's path (meta build, to_empty, init_weights) ends with the pretrained weights."""
    cfg = tiny(False)
    state = randomized(cfg, 11).state_dict()
    C.save_weights(state, tmp_path, cfg, layout="original")
    net = WanConfig(**{**vars(cfg), "pretrained": str(tmp_path)}).build("meta").to_empty(device="cpu")
    net.init_weights()
    for k, v in net.state_dict().items():
        assert torch.equal(v, state[k]), k



def test_lora_network_takes_a_wan_folder_as_its_base_weights(tmp_path):
    """A network with LoRA adapters (built on meta, as the strategy does, or loaded through init_from) reads a
    Wan folder into its base layers; the adapters are not in the folder and keep their values."""
    from nemo_vfm.inference.checkpoint import load_pretrained as init_from
    from nemo_vfm.models.common.lora import LoRAConfig, apply_lora, init_lora_weights

    cfg = tiny(False)
    state = randomized(cfg, 12).state_dict()
    C.save_weights(state, tmp_path, cfg, layout="diffusers")
    net = WanConfig(**{**vars(cfg), "pretrained": str(tmp_path)}).build("meta")
    apply_lora(net, LoRAConfig(rank=2, targets=("ffn.0", "self_attn.q")))
    net.to_empty(device="cpu")
    net.init_weights()
    init_lora_weights(net, seed=1)
    adapters = {k: v.clone() for k, v in net.state_dict().items() if ".lora_" in k}
    assert len(adapters) == 2 * 2 * 2
    for k, v in net.state_dict().items():
        if ".lora_" not in k:
            assert torch.equal(v, state[k.replace(".base.", ".")]), k
    other = randomized(cfg, 13)
    apply_lora(other, LoRAConfig(rank=2, targets=("ffn.0", "self_attn.q")))
    init_lora_weights(other, seed=1)
    init_from(other, tmp_path)  # init_from=WAN_FOLDER into a LoRA network
    for k, v in other.state_dict().items():
        assert torch.equal(v, adapters[k] if ".lora_" in k else state[k.replace(".base.", ".")]), k

def test_trains_through_train(tmp_path):
    """Wan T2V follows the family contract: train() with Wan's objective runs, loss finite, checkpoint written."""
    import math

    from nemo_vfm.data.synthetic import MockLatentDataModule
    from nemo_vfm.models.wan.flavors import wan_config, wan_objective
    from nemo_vfm.train import ExperimentConfig, TrainerConfig, train

    data = MockLatentDataModule(latent_channels=4, num_frames=2, height=4, width=4, context_dim=16, context_length=5,
                                batch_size=2, num_samples=4)
    trainer = TrainerConfig(max_steps=2, devices=1, accelerator="cpu", precision="32-true", log_every_n_steps=1,
                            checkpoint_every_n_steps=2, enable_progress_bar=False)
    out = train(model=wan_config("tiny"), data=data, trainer=trainer, objective=wan_objective("tiny"), ema_decay=0.99,
                log=ExperimentConfig(name="wan", root=str(tmp_path), tensorboard=False))
    assert out["step"] == 2 and math.isfinite(out["loss"])
