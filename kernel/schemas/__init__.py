"""Pydantic request/response models: the API's edges."""
