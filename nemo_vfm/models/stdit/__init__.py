"""ST-DiT family: spatial / temporal (/ full) factorized attention with adaLN, cross-attention and MLP."""
