"""The text models: transformer-classifier and transformer-lm, on a text dataset's token ids.

``definition`` is torch-free (the catalogue reads it); ``builder`` builds the torch modules.
"""
