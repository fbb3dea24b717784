"""The per-dataset privacy ledger, its audit, and its entries in words."""
