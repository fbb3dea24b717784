"""Who may do what: API keys, per-dataset roles, grants and invitations, dashboard sessions."""
