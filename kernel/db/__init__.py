"""The database: engine and sessions, the ORM models, and the small helpers every query needs."""
