"""Dense models on the flattened features: logistic and linear regression, the MLP.

``definition`` is torch-free (the catalogue reads it); ``builder`` builds the torch modules.
"""
