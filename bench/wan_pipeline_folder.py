"""A Wan diffusers pipeline folder with random weights at a published flavor's sizes, for timing ``vfm generate``.

    python bench/wan_pipeline_folder.py --flavor t2v_14b --out /tmp/wan14b --device cuda     # ~40 GB on disk
    python bench/wan_pipeline_folder.py --flavor tiny --out /tmp/wan_tiny --text-layers 1 --device cpu

Writes ``transformer/`` (the flavor's :class:`~nemo_vfm.models.wan.model.WanConfig`, bf16, the network's own
initialisation), ``vae/`` (diffusers' ``AutoencoderKLWan`` at its default config, the Wan 2.1 VAE: 16 channels,
4x8x8), ``text_encoder/`` (UMT5 at UMT5-XXL's width: d_model 4096, 64 heads, gated FFN 10240, vocabulary 256,384;
``--text-layers`` of its 24 layers), ``tokenizer/`` (a word-level tokenizer: the real one is a SentencePiece file this
machine may not have) and ``model_index.json``. Random weights change neither the FLOPs nor the memory of a
denoising step, so the folder times ``vfm generate`` as the published one would; its videos are noise. For the tiny
flavor the VAE and text encoder shrink too (CPU tests).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

if not __package__:  # run as `python bench/NAME.py`: import bench as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

WORDS = "a the red blue green circle square moving left right up down over under slowly quickly camera pans zooms".split()


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer over :data:`WORDS` (unknown words map to ``<unk>``), ``</s>`` appended."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.normalizer, tk.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    tk.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"]))
    tk.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(str(folder))


def _built_on(device: torch.device, dtype: torch.dtype, make):
    """``make()`` with its parameters created on ``device`` in ``dtype`` (no CPU copy of a large network)."""
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return make()
    finally:
        torch.set_default_dtype(prev)


def write_folder(flavor: str, out: Path, device: torch.device, text_layers: int = 24, seed: int = 0) -> Path:
    """Write the pipeline folder of ``flavor`` into ``out``; returns ``out``."""
    import diffusers
    import transformers

    from nemo_vfm.models.wan.convert import save_weights
    from nemo_vfm.models.wan.flavors import wan_config

    tiny = flavor == "tiny"
    torch.manual_seed(seed)
    cfg = wan_config(flavor)
    net = _built_on(device, torch.bfloat16, cfg.build)
    save_weights(net.state_dict(), out / "transformer", cfg, layout="diffusers")
    del net
    vae_kw = (dict(base_dim=8, z_dim=cfg.out_channels, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                   latents_mean=[0.0] * cfg.out_channels, latents_std=[1.0] * cfg.out_channels) if tiny else {})
    _built_on(device, torch.float32, lambda: diffusers.AutoencoderKLWan(**vae_kw)).save_pretrained(str(out / "vae"))
    text = (dict(vocab_size=64, d_model=cfg.context_dim, d_kv=4, d_ff=32, num_heads=4) if tiny else
            dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_heads=64, feed_forward_proj="gated-gelu"))
    enc = _built_on(device, torch.bfloat16, lambda: transformers.UMT5EncoderModel(
        transformers.UMT5Config(num_layers=text_layers, **text)))
    enc.save_pretrained(str(out / "text_encoder"))
    del enc
    write_tokenizer(out / "tokenizer")
    (out / "model_index.json").write_text(json.dumps({
        "_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"], "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"], "random_weights": True}, indent=2))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flavor", default="t2v_14b", help="a Wan flavor (nemo_vfm.models.wan.flavors), e.g. t2v_14b")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--text-layers", type=int, default=24, help="UMT5 encoder layers (UMT5-XXL: 24)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    if (a.out / "model_index.json").is_file():
        print(f"{a.out} exists; kept")
        return 0
    write_folder(a.flavor, a.out, torch.device(a.device), a.text_layers)
    size = sum(f.stat().st_size for f in a.out.rglob("*") if f.is_file())
    print(f"wrote {a.out} ({size / 2**30:.1f} GiB, random weights, flavor {a.flavor})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
