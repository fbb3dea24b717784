"""cnn2-gn, the two-layer CNN of the DC-DPSGD paper's MNIST experiments, with GroupNorm.

``definition`` is torch-free (the catalogue reads it); ``builder`` builds the torch module.
"""
