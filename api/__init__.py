"""The HTTP service: FastAPI routes, problems, limits and the dashboard. The only package that imports FastAPI."""
