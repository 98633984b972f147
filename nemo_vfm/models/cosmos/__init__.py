"""Cosmos-Predict2.5 family: 2B / 14B, Text2World and Video2World, with diffusers and original weight names."""
