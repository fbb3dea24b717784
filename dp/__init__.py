"""The DP engine on torch, by role; the algorithm families in ``algorithms/`` are built on it.

- ``per_example``: per-sample gradients (the vmap engine), the ghost engine (``ghost``, one
  module per layer family), per-sample maps (Abadi clipping, Auto-S, DP-PSAC) and clipping that
  holds in floating point.
- ``randomness``: the per-job secure stream every privacy-protecting draw comes from, the
  Gaussian mechanism on a sum, exact discrete samplers, Poisson subsampling.
- ``loop``: the DP batch loop (written once), its resumable state, and what plugs into it:
  per-unit aggregation and augmentation multiplicity.
- ``data``: a job's rows, images and tokens read batch by batch onto the training device.
- ``losses``, ``precision``: training losses by name; fp32 or bf16 arithmetic.
"""
