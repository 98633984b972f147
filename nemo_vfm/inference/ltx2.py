"""LTX-2's generation adapter: ``vfm generate`` does not sample LTX-2 yet (it needs the release's video and audio
VAEs, vocoder, Gemma 3 text encoder and text connectors, none of which is built here); it fails naming the way out."""

from nemo_vfm.inference.generation import FamilyGeneration

GENERATION = FamilyGeneration(
    family="ltx2",
    unavailable="vfm generate is not implemented for LTX-2 (its VAEs, vocoder, Gemma 3 encoder and text connectors "
                "are not built here); export the model with `vfm export --format diffusers` (or the LoRA with "
                "`--format lora` / `--format comfyui`) and sample with diffusers' LTX2Pipeline or ComfyUI")
