"""A job's life: its statuses and the transitions that move it (kernel.jobs.lifecycle)."""
