"""Training data: synthetic videos, latent datasets, Energon task encoders, packing."""
