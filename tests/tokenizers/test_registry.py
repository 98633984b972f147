"""Choosing tokenizers and text encoders by name, from Python and from one command-line string."""

import pytest
import torch

from nemo_vfm.tokenizers.causal import CausalVideoTokenizer
from nemo_vfm.tokenizers.identity import IdentityTokenizer
from nemo_vfm.tokenizers.registry import (
    TEXT_ENCODERS,
    TOKENIZERS,
    build_text_encoder,
    build_tokenizer,
    parse_spec,
    tokenizer_from_spec,
)
from nemo_vfm.tokenizers.tiling import TiledTokenizer


def test_names_and_errors():
    assert {"identity", "causal", "cosmos_diffusers", "wan", "hunyuan", "cosmos_jit"} <= set(TOKENIZERS)
    assert {"hash", "t5", "umt5"} <= set(TEXT_ENCODERS)
    assert isinstance(build_tokenizer("identity", spatial_compression=2), IdentityTokenizer)
    with pytest.raises(ValueError, match="unknown tokenizer 'vqgan'; choose one of: identity, causal"):
        build_tokenizer("vqgan")
    with pytest.raises(ValueError, match="unknown text encoder 'clip'; choose one of: hash, t5, umt5"):
        build_text_encoder("clip")
    with pytest.raises(ValueError, match=r"'wan' needs path=\.\.\."):
        build_tokenizer("wan")
    with pytest.raises(ValueError, match=r"does not take \['bogus'\]; it takes: path"):
        build_tokenizer("wan", path="x", bogus=1)
    with pytest.raises(ValueError, match="unknown option.*widht.*valid: checkpoint"):
        build_tokenizer("causal", widht=8)


def test_spec_strings():
    assert parse_spec("wan") == ("wan", {})
    name, kw = parse_spec("causal:checkpoint=/a/b.pt, tile_size=256,chunk_latents=2,sample=true,scale=0.5,x=none")
    assert name == "causal" and kw == {"checkpoint": "/a/b.pt", "sample": True, "scale": 0.5, "x": None,
                                       "tiling": {"tile_size": 256, "chunk_latents": 2}}
    with pytest.raises(ValueError, match="key=value"):
        parse_spec("wan:path")


def test_causal_by_name_checkpoint_and_tiling(tmp_path):
    tok = tokenizer_from_spec("causal:width=4,latent_channels=4,max_mult=1,tiling=true")
    assert isinstance(tok, TiledTokenizer) and isinstance(tok.inner, CausalVideoTokenizer)
    tok.inner.save_checkpoint(tmp_path / "tokenizer.pt")
    loaded = build_tokenizer("causal", checkpoint=str(tmp_path / "tokenizer.pt"))
    x = torch.rand(1, 3, 5, 16, 16) * 2 - 1
    assert torch.equal(loaded.encode(x), tok.inner.encode(x))
    with pytest.raises(ValueError, match="cannot be combined with a checkpoint"):
        build_tokenizer("causal", checkpoint=str(tmp_path / "tokenizer.pt"), width=8)


def test_data_preparation_routes_through_the_registry():
    from nemo_vfm.data.encoders import build_text_encoder as data_text
    from nemo_vfm.data.encoders import build_tokenizer as data_tok

    assert isinstance(data_tok("causal", width=4, latent_channels=4), CausalVideoTokenizer)
    assert data_text("hash", dim=8, max_length=4).encode(["a b"])[0].shape == (1, 4, 8)


def test_text_encoders_are_placed_in_bf16_off_the_cpu():
    from nemo_vfm.tokenizers.registry import text_encoder_placed

    kw = {"path": "/ckpt", "max_length": 512}
    assert text_encoder_placed("umt5", kw, "cuda:1") == {**kw, "device": "cuda:1", "dtype": "bf16"}
    assert text_encoder_placed("qwen2_5_vl", kw, torch.device("cpu")) == {**kw, "device": "cpu"}
    assert text_encoder_placed("umt5", {**kw, "dtype": "fp32"}, "cuda")["dtype"] == "fp32"  # an explicit choice stays
    assert text_encoder_placed("hash", {"dim": 8}, "cuda") == {"dim": 8}  # takes no device
    assert text_encoder_placed("nope", {"a": 1}, "cuda") == {"a": 1}  # the build names the unknown encoder
    assert kw == {"path": "/ckpt", "max_length": 512}
