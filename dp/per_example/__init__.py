"""Per-example gradients and their clipped sums: the vmap engine, the ghost engine, per-sample maps."""
