"""Diffusion objectives and samplers. Network-agnostic: every function takes the network as an argument.

- :class:`EDM` (Karras et al. 2022): preconditioning, log-normal sigma, weighted denoising loss.
- :class:`DDPMPrecond`: EDM's iDDPM (VP, discrete-timestep) preconditioning, for epsilon-prediction
  networks such as the published DiT checkpoints.
- :class:`FlowMatching`: rectified flow with a velocity target and logit-normal (shifted) times.
- ``samplers``: Heun (2nd order) and Euler on the Karras schedule; Euler for flow matching; the few-step sampler
  of a distilled student.
- ``guidance``: classifier-free guidance and conditioning dropout.
- ``distillation``: the DMD2 objective (:class:`~nemo_vfm.diffusion.distillation.DMD2`) over a frozen teacher, a
  critic and a few-step student, all taken as arguments.
"""
