"""Video tokenizers (pixels <-> latents) and text encoders (captions -> embeddings)."""
