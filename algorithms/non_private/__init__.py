"""The non-private optimizers (``sgd``, ``adam``), for public datasets only."""
