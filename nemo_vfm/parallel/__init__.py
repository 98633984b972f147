"""Parallelism on a device mesh: FSDP2, tensor/sequence, context (ring, Ulysses, hybrid), pipeline and expert
parallel, activation checkpointing and offload, and distributed checkpoints."""
