"""The KL-condition family: KL-Spider, adaptive noisy GD, noisy GD, the proximal-point method."""
