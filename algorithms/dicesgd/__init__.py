"""DiceSGD: DP-SGD with a hidden error-feedback vector."""
