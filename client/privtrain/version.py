"""The client's version: sent as its User-Agent and printed by ``privtrain --version``."""

__version__ = "0.1.0"
