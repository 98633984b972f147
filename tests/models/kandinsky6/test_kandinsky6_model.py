"""Kandinsky 6: our network reproduces diffusers' Kandinsky6Transformer3DModel (fp32, CPU, <= 1e-5) on tiny configs
unlike the released ones (odd widths and frame counts, non-square grids, masked prompts), with audio on and off, with
the pipeline's image conditioning (tail frame), and with each released switch off; the converters round-trip, and a
renamed or unknown layer raises naming it."""

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from nemo_vfm.models.kandinsky6 import convert as C  # noqa: E402
from nemo_vfm.models.kandinsky6.flavors import FLAVORS  # noqa: E402
from nemo_vfm.models.kandinsky6.model import Kandinsky6Config  # noqa: E402


def tiny(**kw):
    base = dict(FLAVORS["tiny"], num_layers=2, hidden_size=42, ffn_size=50, time_dim=22, axes_dims=(2, 4, 8),
                audio_hidden_size=28, audio_ffn_size=36, audio_time_dim=18, in_channels=3, out_channels=3,
                context_dim=10, pooled_dim=6, audio_channels=5, audio_out_channels=7, patch_size=(1, 2, 2))
    return Kandinsky6Config(**{**base, **kw})


def pair(cfg, seed=0):
    """Ours and diffusers' with the same (perturbed, nonzero) weights."""
    torch.manual_seed(seed)
    ours = cfg.build()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ref = diffusers.Kandinsky6Transformer3DModel(**C.config_to_diffusers(cfg)).eval()
    ref.load_state_dict(C.to_diffusers(ours.state_dict()), strict=True)
    return ours.eval(), ref


def inputs(cfg, T=3, H=4, W=6, L=5, A=7, B=2):
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[0, 3:] = False
    return dict(x=torch.randn(B, cfg.in_channels, T, H, W, generator=g), t=torch.rand(B, generator=g),
                context=torch.randn(B, L, cfg.context_dim, generator=g), mask=mask,
                pooled=torch.randn(B, cfg.pooled_dim, generator=g),
                audio=torch.randn(B, A, cfg.audio_channels, generator=g),
                image=torch.randn(B, cfg.in_channels, H, W, generator=g))


def reference(ref, cfg, b, audio=True, image=False):
    """diffusers' transformer called as Kandinsky6TI2VAPipeline calls it."""
    lat = b["x"].permute(0, 2, 3, 4, 1)
    T = lat.shape[1]
    types = pos = None
    if image:
        lat = torch.cat([lat, b["image"].permute(0, 2, 3, 1)[:, None]], 1)
        types = torch.zeros(lat.shape[0], T + 1, dtype=torch.long)
        types[:, -1] = 1
        pos = (torch.cat([torch.arange(T), torch.zeros(1, dtype=torch.long)]), torch.arange(lat.shape[2] // 2),
               torch.arange(lat.shape[3] // 2))
    cond_mask = torch.zeros(*lat.shape[:-1], 1)
    if image:
        cond_mask[:, -1] = 1
    inp = torch.cat([lat, torch.zeros_like(lat), cond_mask], -1)
    out = ref(hidden_states=inp, encoder_hidden_states=b["context"], pooled_projections=b["pooled"],
              timestep=b["t"] * 1000, audio_hidden_states=b["audio"] if audio else None, visual_rope_pos=pos,
              encoder_attention_mask=b["mask"], visual_token_type_ids=types, return_dict=False)
    video = out[0][:, :T].permute(0, 4, 1, 2, 3)
    return (video, out[1]) if audio else video


def ours_out(net, b, audio=True, image=False):
    return net(b["x"], b["t"], b["context"], b["mask"], b["pooled"], audio=b["audio"] if audio else None,
               image_latents=b["image"] if image else None)


def close(a, b, tol=1e-5):
    assert a.shape == b.shape, (a.shape, b.shape)
    assert (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item()), (a - b).abs().max().item()


@pytest.mark.parametrize("audio", [True, False])
def test_forward_matches_diffusers(audio):
    cfg = tiny()
    ours, ref = pair(cfg)
    b = inputs(cfg)
    with torch.no_grad():
        got, want = ours_out(ours, b, audio), reference(ref, cfg, b, audio)
    if audio:
        close(got[0], want[0])
        close(got[1], want[1])
        assert got[1].shape == (2, 7, cfg.audio_out_channels)
    else:
        close(got, want)
    assert got[0].shape[1:] == b["x"].shape[1:] if audio else got.shape == b["x"].shape


def test_image_conditioning_matches_pipeline_call():
    cfg = tiny()
    ours, ref = pair(cfg, seed=3)
    b = inputs(cfg, T=2, H=6, W=4)
    with torch.no_grad():
        got, want = ours_out(ours, b, True, True), reference(ref, cfg, b, True, True)
    close(got[0], want[0])
    close(got[1], want[1])


@pytest.mark.parametrize("switches", [dict(ca_rope=False, cross_gates=False, fix_modulation=False, audio_time_dim=None,
                                           num_token_types=0),
                                      dict(patch_size=(2, 1, 2), visual_cond=False, audio_hidden_size=None,
                                           audio_ffn_size=None, audio_axes_dims=(6, 4, 4), ca_rope=True)])
def test_variants_match_diffusers(switches):
    cfg = tiny(**switches)
    ours, ref = pair(cfg, seed=5)
    b = inputs(cfg, T=4, H=2, W=6, L=3, A=5, B=1)
    with torch.no_grad():
        got = ours_out(ours, b)
        if cfg.visual_cond:
            want = reference(ref, cfg, b)
        else:
            out = ref(hidden_states=b["x"].permute(0, 2, 3, 4, 1), encoder_hidden_states=b["context"],
                      pooled_projections=b["pooled"], timestep=b["t"] * 1000, audio_hidden_states=b["audio"],
                      encoder_attention_mask=b["mask"], return_dict=False)
            want = (out[0].permute(0, 4, 1, 2, 3), out[1])
    close(got[0], want[0])
    close(got[1], want[1])


def test_converters_round_trip_and_param_count_matches():
    cfg = tiny()
    ours = cfg.build()
    state = ours.state_dict()
    theirs = C.to_diffusers(state)
    back = C.from_diffusers(theirs)
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    ref = diffusers.Kandinsky6Transformer3DModel(**C.config_to_diffusers(cfg))
    assert set(theirs) == set(ref.state_dict())
    assert C.config_from_json(C.config_json(cfg)) == cfg
    assert sum(v.numel() for v in theirs.values()) == ours.num_params()


def test_diffusers_defaults_are_declared():
    import inspect

    sig = inspect.signature(diffusers.Kandinsky6Transformer3DModel.__init__).parameters
    got = {k: p.default for k, p in sig.items() if p.default is not inspect.Parameter.empty}
    assert {k: tuple(v) if isinstance(v, list) else v for k, v in got.items()} == C.DIFFUSERS_DEFAULTS


def test_folder_round_trip(tmp_path):
    cfg = tiny()
    ours, ref = pair(cfg)
    ref.save_pretrained(tmp_path / "transformer")
    assert C.read_config(tmp_path) == cfg
    loaded = C.load_pretrained(tmp_path)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in ours.state_dict().items())
    C.save_weights(ours.state_dict(), tmp_path / "ours", cfg)
    again = diffusers.Kandinsky6Transformer3DModel.from_pretrained(tmp_path / "ours")
    assert all(torch.equal(again.state_dict()[k], v) for k, v in ref.state_dict().items())


def test_bad_keys_raise_naming_them():
    with pytest.raises(KeyError, match="visual_transformer_blocks.0.bogus_attention.weight"):
        C.from_diffusers_name("visual_transformer_blocks.0.bogus_attention.weight")
    with pytest.raises(KeyError, match="final_proj.weight"):
        C.from_diffusers({"final_proj.weight": torch.zeros(1)})
    with pytest.raises(KeyError, match="head.weight"):
        C.to_diffusers_name("head.weight")


def test_renamed_layer_in_a_folder_raises(tmp_path):
    from safetensors.torch import load_file, save_file

    cfg = tiny()
    ours, ref = pair(cfg)
    ref.save_pretrained(tmp_path)
    f = next(tmp_path.glob("*.safetensors"))
    state = load_file(str(f))
    state["visual_transformer_blocks.1.video_dec_block.self_attn.to_query.weight"] = state.pop(
        "visual_transformer_blocks.1.video_dec_block.self_attention.to_query.weight")
    save_file(state, str(f))
    with pytest.raises(Exception, match="self_attn"):
        C.load_pretrained(tmp_path)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="hidden_size"):
        tiny(hidden_size=50)
    with pytest.raises(ValueError, match="ca_rope"):
        tiny(audio_axes_dims=(2, 2, 24))
    with pytest.raises(ValueError, match="pooled_context"):
        cfg = tiny()
        b = inputs(cfg)
        cfg.build()(b["x"], b["t"], b["context"], b["mask"])


@pytest.mark.parametrize("audio", [True, False])
def test_flops_match_flop_counter(audio):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from nemo_vfm.models.kandinsky6.flops import kandinsky6_forward_flops

    for cfg in (tiny(), tiny(cross_gates=False, fix_modulation=False, audio_time_dim=None, visual_cond=False)):
        net = cfg.build()
        b = inputs(cfg, T=3, H=4, W=6, L=5, A=7, B=1)
        with FlopCounterMode(display=False) as fc, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
            ours_out(net, b, audio)
        counts = {str(k): v for k, v in fc.get_flop_counts()["Global"].items()}
        attention = counts.pop("aten.bmm", 0) + counts.pop("aten.baddbmm", 0)  # SDPA's math backend
        got = kandinsky6_forward_flops(cfg, [18], [5], audio_lens=[7] if audio else None)
        assert (got.linear, got.attention) == (sum(counts.values()), attention) and attention > 0


def test_a_fully_masked_prompt_matches_diffusers():
    """CFG dropout's null prompt (mask all False): zero text attention, as diffusers on torch's SDPA gives."""
    cfg = tiny()
    ours, ref = pair(cfg, seed=2)
    b = inputs(cfg)
    b["mask"][0] = False
    with torch.no_grad():
        got, want = ours_out(ours, b), reference(ref, cfg, b)
    assert torch.isfinite(got[0]).all()
    close(got[0], want[0])
    close(got[1], want[1])
