"""Private hyperparameter tuning: many trials, only the best released, one ledger entry (docs/tuning.md)."""
