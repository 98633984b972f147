"""Single-device model code. Parallelism is applied from outside (see ``nemo_vfm.parallel``)."""
