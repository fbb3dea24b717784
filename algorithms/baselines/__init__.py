"""The DP-SGD-family baselines: DP-Adam, Auto-S, DP-PSAC."""
