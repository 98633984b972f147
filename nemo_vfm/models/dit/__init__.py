"""DiT family: adaLN-Zero video DiT with optional cross-attention, QK-norm and AdaLN-LoRA."""
