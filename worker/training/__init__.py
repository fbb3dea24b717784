"""Torch-side training pieces: the model zoo (`models`) and model artifacts (`artifacts`)."""
