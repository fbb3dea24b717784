"""The image zoo: wrn, resnet-gn, cnn and vit, for images (C, H, W).

``definition`` is torch-free (the catalogue reads it); ``builder`` builds the torch modules.
"""
