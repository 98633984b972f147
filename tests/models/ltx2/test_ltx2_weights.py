"""LTX-2 weights: converters both ways, folders in both layouts (ours and diffusers' own save_pretrained), a release
file with its extra components, the published flavor on meta, and errors naming what is wrong."""

import pytest
import torch

from nemo_vfm.models.ltx2 import convert as C
from nemo_vfm.models.ltx2.flavors import ltx2_config

diffusers = pytest.importorskip("diffusers")

from tests.models.ltx2.test_ltx2 import diffusers_forward, inputs, randomized, reference, tiny  # noqa: E402


def test_converters_round_trip_and_names():
    cfg = tiny(gated_attn=True, cross_attn_mod=True, audio_cross_attn_mod=True)
    state = randomized(cfg).state_dict()
    d = C.to_diffusers(state)
    assert len(d) == len(state)
    assert C.from_diffusers(d).keys() == state.keys()
    assert all(C.from_diffusers(d)[k] is v for k, v in state.items())
    o = C.to_original(state)
    assert all(k.startswith("model.diffusion_model.") for k in o)
    assert C.from_original(o).keys() == state.keys()
    for want in ("proj_in.weight", "audio_proj_in.bias", "time_embed.emb.timestep_embedder.linear_1.weight",
                 "audio_time_embed.linear.weight", "av_cross_attn_video_a2v_gate.linear.weight",
                 "av_cross_attn_audio_scale_shift.emb.timestep_embedder.linear_2.bias",
                 "transformer_blocks.1.attn1.norm_q.weight", "transformer_blocks.0.audio_to_video_attn.norm_k.weight",
                 "transformer_blocks.0.video_a2v_cross_attn_scale_shift_table",
                 "transformer_blocks.0.audio_a2v_cross_attn_scale_shift_table", "transformer_blocks.0.ff.net.0.proj.weight",
                 "transformer_blocks.0.attn2.to_gate_logits.weight", "prompt_adaln.linear.weight",
                 "caption_projection.linear_1.weight", "audio_scale_shift_table", "audio_proj_out.weight"):
        assert want in d, want
    assert C.config_from_diffusers(C.config_json(cfg, "diffusers")) == cfg


def test_diffusers_converter_of_the_release_agrees():
    """Our release -> diffusers names are diffusers' own single-file converter's."""
    from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers

    state = randomized(tiny()).state_dict()
    release = C.to_original(state)
    release["model.diffusion_model.video_embeddings_connector.x.weight"] = torch.zeros(1)
    theirs = convert_ltx2_transformer_to_diffusers(dict(release))
    assert set(theirs) == set(C.to_diffusers(state))


@pytest.mark.parametrize("layout", ["diffusers", "original"])
def test_saved_folder_loads_and_matches_diffusers(tmp_path, layout):
    cfg = tiny(rope_type="split", audio_num_heads=3)
    net = randomized(cfg, 2)
    state = net.state_dict()
    C.save_weights(state, tmp_path / "w", cfg, layout=layout, max_shard_bytes=20_000)
    assert len(list((tmp_path / "w").glob("*.safetensors"))) > 1
    loaded = C.load_pretrained(tmp_path / "w").eval()
    assert loaded.cfg == C.read_config(tmp_path / "w", pretrained=str(tmp_path / "w"))
    for k, v in state.items():
        assert torch.equal(loaded.state_dict()[k], v), k
    ref = reference(cfg, state)
    x, audio, t, ctx, actx, mask = inputs(cfg, seed=4)
    with torch.no_grad():
        v, a = loaded(x, t, ctx, mask, audio=audio, audio_context=actx, audio_context_mask=mask)
        rv, ra = diffusers_forward(ref, loaded, x, audio, t, ctx, actx, mask)
    assert (v - rv).abs().max() <= 1e-5 and (a - ra).abs().max() <= 1e-5


def test_diffusers_save_pretrained_pipeline_folder_loads(tmp_path):
    cfg = tiny()
    net = randomized(cfg, 3)
    ref = reference(cfg, net.state_dict())
    ref.save_pretrained(tmp_path / "pipe" / "transformer")
    assert C.is_ltx2_folder(tmp_path / "pipe")
    with pytest.raises(ValueError, match="audio_mel_bins"):  # diffusers' config does not record it
        C.read_config(tmp_path / "pipe")
    loaded = C.load_pretrained(tmp_path / "pipe", config=C.read_config(tmp_path / "pipe", audio_mel_bins=3))
    for k, v in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_release_file_with_other_components_loads_with_a_config(tmp_path):
    from safetensors.torch import save_file

    cfg = tiny()
    state = randomized(cfg, 5).state_dict()
    release = {k: v.contiguous() for k, v in C.to_original(state).items()}
    release.update({"model.diffusion_model.audio_embeddings_connector.w": torch.zeros(2), "vae.encoder.w": torch.zeros(2),
                    "vocoder.w": torch.zeros(2), "text_embedding_projection.w": torch.zeros(2)})
    save_file(release, str(tmp_path / "ltx-2.safetensors"))
    with pytest.raises(ValueError, match="config=ltx2_config"):
        C.load_pretrained(tmp_path / "ltx-2.safetensors")
    loaded = C.load_pretrained(tmp_path / "ltx-2.safetensors", config=cfg)
    for k, v in state.items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_a_renamed_layer_is_named(tmp_path):
    cfg = tiny()
    state = randomized(cfg).state_dict()
    state["transformer_blocks.1.attn2.to_kk.weight"] = state.pop("transformer_blocks.1.attn2.to_k.weight")
    C.save_weights(state, tmp_path, cfg)
    with pytest.raises(Exception, match=r"transformer_blocks\.1\.attn2\.to_k"):
        C.load_pretrained(tmp_path)


def test_unsupported_diffusers_arguments_are_named():
    with pytest.raises(NotImplementedError, match="use_keyframes_abs_pos_embedding"):
        C.config_from_diffusers({"use_keyframes_abs_pos_embedding": True})
    with pytest.raises(ValueError, match="rope_type"):
        tiny(rope_type="other")


def test_published_flavor_on_meta_matches_diffusers_names():
    cfg = ltx2_config("ltx2_19b")
    net = cfg.build("meta")
    assert 18.5e9 < net.num_params() < 19.5e9  # "19B": 14B video + 5B audio stream
    from diffusers import LTX2VideoTransformer3DModel

    with torch.device("meta"):
        ref = LTX2VideoTransformer3DModel(**C.config_to_diffusers(cfg))
    ours = {C.to_diffusers_name(k): tuple(v.shape) for k, v in net.state_dict().items()}
    assert ours == {k: tuple(v.shape) for k, v in ref.state_dict().items()}
