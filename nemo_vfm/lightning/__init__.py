"""Lightning adapters: the training module, checkpointing that survives crashes, callbacks."""
