"""DP-SGD with Poisson sampling."""
