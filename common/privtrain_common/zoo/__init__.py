"""The model zoo: its torch-free table (``catalogue``) and the torch modules built from it (``architectures``)."""
