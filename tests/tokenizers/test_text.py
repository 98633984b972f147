"""T5 / UMT5 encoders from tiny local configs (offline word-level tokenizer), masks, and the embedding cache."""

import pytest
import torch

from nemo_vfm.tokenizers.registry import build_text_encoder, text_encoder_from_spec
from nemo_vfm.tokenizers.text_cache import CachedTextEncoder

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = "a red green blue circle square triangle moving left right up down on background black gray navy"


def _tokenizer(folder):
    """A word-level tokenizer trained here (no download) that appends </s> like T5's."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.normalizer, tk.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tk.train_from_iterator([WORDS], trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"]))
    tk.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>",
                                                unk_token="<unk>")
    fast.save_pretrained(str(folder))


@pytest.fixture(scope="module", params=["t5", "umt5"])
def model_dir(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    torch.manual_seed(0)
    cfg_cls, model_cls = ((transformers.T5Config, transformers.T5EncoderModel) if request.param == "t5"
                          else (transformers.UMT5Config, transformers.UMT5EncoderModel))
    cfg = cfg_cls(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4)
    model_cls(cfg).save_pretrained(str(root / "text_encoder"))  # pipeline layout: text_encoder/ + tokenizer/
    _tokenizer(root / "tokenizer")
    return request.param, root


def test_encoder_masks_and_padding(model_dir):
    variant, root = model_dir
    enc = build_text_encoder(variant, path=str(root))
    assert enc.max_length == 512 and enc.dim == 16
    emb, mask = enc.encode(["a red circle", "a blue square moving left on a gray background"])
    assert emb.shape == (2, 512, 16) and mask.dtype == torch.bool
    assert mask.sum(1).tolist() == [4, 10]  # words + </s>
    assert emb[0, 4:].abs().max() == 0 and emb[0, :4].abs().sum() > 0  # padding is zero
    short = text_encoder_from_spec(f"{variant}:path={root},max_length=6,pad_to_max_length=false")
    emb_s, mask_s = short.encode(["a red circle", "a blue square moving left on a gray background"])
    assert emb_s.shape == (2, 6, 16) and mask_s.sum(1).tolist() == [4, 6]  # truncated to max_length
    # the encoder is bidirectional, so only the untruncated caption matches the long-context output exactly
    assert torch.allclose(emb_s[0, :4], emb[0, :4], atol=1e-5)


def test_embedding_cache_hits_and_matches(model_dir, tmp_path):
    variant, root = model_dir
    enc = build_text_encoder(variant, path=str(root), max_length=16)
    cached = build_text_encoder(variant, path=str(root), max_length=16, cache_dir=str(tmp_path / "cache"))
    assert isinstance(cached, CachedTextEncoder)
    captions = ["a red circle", "a green triangle moving up", "a red circle"]
    emb, mask = cached.encode(captions)
    ref, ref_mask = enc.encode(captions)
    assert torch.equal(mask, ref_mask) and torch.allclose(emb, ref, atol=1e-2)  # float16 storage
    assert (cached.hits, cached.misses) == (0, 2)
    again = CachedTextEncoder(enc, tmp_path / "cache")  # a new process reads the files
    assert torch.equal(again.encode(captions)[0], emb) and (again.hits, again.misses) == (3, 0)
    assert again.embed("a green triangle moving up").shape == (6, 16)
    other = CachedTextEncoder(build_text_encoder("hash", dim=16, max_length=16), tmp_path / "cache")
    other.encode(["a red circle"])
    assert other.misses == 1  # another encoder never reads these entries


def test_missing_tokenizer_is_reported(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4)
    transformers.T5EncoderModel(cfg).save_pretrained(str(tmp_path / "m"))
    with pytest.raises(FileNotFoundError, match="tokenizer_path"):
        build_text_encoder("t5", path=str(tmp_path / "m"))


@pytest.fixture
def dit_attention_flags():
    """The process-wide SDPA flags training and `vfm generate` set for the DiT on CUDA (cuDNN + efficient, math as
    the last resort)."""
    from nemo_vfm.parallel.sdpa_backend import select_sdpa_backend

    select_sdpa_backend("cudnn")
    yield
    select_sdpa_backend("default")


def test_encoder_runs_under_the_dit_attention_flags(model_dir, dit_attention_flags):
    """UMT5's float position bias fits none of the DiT's fused kernels (on CPU, none at all): math, kept on as the
    last resort, runs it, so prompts still encode, to the same embeddings."""
    variant, root = model_dir
    enc = build_text_encoder(variant, path=str(root))
    b = torch.backends.cuda  # the flags are narrowed in this test (flash off: the CPU's only fused kernel)
    assert not b.flash_sdp_enabled() and b.cudnn_sdp_enabled() and b.math_sdp_enabled()
    emb, mask = enc.encode(["a red circle"])
    from nemo_vfm.parallel.sdpa_backend import select_sdpa_backend

    select_sdpa_backend("default")
    ref, _ = enc.encode(["a red circle"])
    assert torch.allclose(emb, ref, atol=1e-5, rtol=1e-5) and mask.sum() == 4  # math vs the CPU's flash kernel
