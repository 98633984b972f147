"""MovieGen family: Llama-style video transformer (RMSNorm, SwiGLU, GQA, learnable 3D positions, adaLN-single)."""
