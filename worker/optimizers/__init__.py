"""DP optimizers, one module per algorithm family, on the per-sample gradient engines.

Shared machinery:

- `per_sample`: the vmap engine (per-sample gradients in bounded chunks, torch.func), the
  `PerSampleMap` protocol and Abadi clipping; `per_sample_maps`: Auto-S and DP-PSAC by name.
- `ghost`: the ghost clipping / book-keeping engine (a package, one module per layer family),
  used instead of the vmap engine wherever it is exact.
- `losses`: training losses by name; `sampling`, `noise`: Poisson subsampling and the Gaussian
  mechanism on a sum; `secure_random`, `discrete_samplers`: every privacy-protecting draw.
- `state`: hooks, resumable state and results shared by every training loop.

Algorithm families:

- `dp_sgd`: DP-SGD (Abadi et al. 2016) and its batch aggregators.
- `dc_dpsgd`, `dc_projection`: DC-DPSGD's aggregators and projected traces.
- `dicesgd`: DiceSGD's error-feedback aggregator.
- `kl_common`, `kl_noisy_gd`, `kl_spider`, `kl_adaptive`: the KL family's full-batch loops.
- `ht_algorithms`, `ht_mechanisms`, `ht_robust_mean`: the heavy-tailed DP-SCO family.
"""
