"""A job's data read batch by batch into the tensors a DP loop uses."""
