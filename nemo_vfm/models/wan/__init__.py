"""Wan 2.1 family: T2V 1.3B / 14B and I2V 14B, with diffusers and original weight layouts."""
