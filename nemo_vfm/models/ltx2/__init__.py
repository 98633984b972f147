"""LTX-2 (Lightricks): joint audio + video diffusion transformer."""
