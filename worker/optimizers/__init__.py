"""DP optimizers, one module per algorithm family, on the per-sample gradient engine.

- `per_sample`: per-sample gradients in bounded chunks and the pluggable per-sample maps.
- `sampling`, `noise`: Poisson subsampling and the Gaussian mechanism on a sum.
- `state`: hooks, resumable state and results shared by every training loop.
- `dp_sgd`: DP-SGD (Abadi et al. 2016).
"""
