"""``vfm export``: a checkpoint as LoRA adapters (diffusers/peft or ComfyUI layout), a diffusers/original model
folder, or our single-file safetensors (see ``nemo_vfm.inference.export``).

    vfm export --ckpt experiments/lora_wan_1_3b --format lora --out wan_lora.safetensors
    vfm export --ckpt experiments/lora_wan_1_3b --format comfyui --out wan_lora_comfy.safetensors
    vfm export --ckpt experiments/finetune_wan_1_3b --format diffusers --out wan_ft/ --dtype bf16
"""

import argparse

from nemo_vfm.inference.export import FORMATS

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ckpt", required=True, help="a step=N.ckpt file or sharded folder, or an experiment folder "
                                                 "(newest checkpoint)")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="lora: adapters only, diffusers/peft layout (diffusers' pipe.load_lora_weights); comfyui: "
                        "adapters only, ComfyUI's layout (LoraLoader; Wan); diffusers / original: the whole model as "
                        "a folder of that layout (LoRA merged); safetensors: ours, for vfm generate")
    p.add_argument("--out", required=True, help="output file (lora, comfyui, safetensors) or folder (diffusers, "
                                                "original)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="cast floating weights (default: as saved)")
    p.add_argument("--no-ema", action="store_true", help="the raw weights instead of the EMA weights")
    p.add_argument("--trust-pickle", action="store_true", help="unpickle a .ckpt that needs more than our config "
                                                               "classes (runs any code the file holds; only for files "
                                                               "you trust)")


def run(args) -> int:
    import torch

    from nemo_vfm.inference.export import export

    dtype = getattr(torch, DTYPES[args.dtype]) if args.dtype else None
    out = export(args.ckpt, args.format, args.out, use_ema=not args.no_ema, dtype=dtype, allow_pickle=args.trust_pickle)
    print(f"wrote {out}")
    return 0
