"""The heavy-tailed high-dimensional DP-SCO family."""
