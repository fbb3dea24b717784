"""Limits that protect the API process: request rates, requests and uploads in flight, upload pace."""
