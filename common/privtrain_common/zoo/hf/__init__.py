"""The `hf` model: a Hugging Face Transformers model built from a job's config (no hub, no remote code).

``families`` and ``definition`` are torch-free (the catalogue reads them); ``builder`` builds the
torch module with Transformers.
"""
