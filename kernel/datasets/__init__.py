"""A dataset's life: registration, content identity, stored arrays, status and deletion."""
