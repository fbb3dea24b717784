"""How the worker reads a dataset's stored arrays into the tensors a trainer uses."""
