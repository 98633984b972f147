"""Generation: sampling videos from trained checkpoints."""
