"""Exceptions of the privacy package; both are ValueErrors so callers can map them to HTTP 4xx."""

from __future__ import annotations


class PrivacyEventError(ValueError):
    """An event, curve or privacy parameter is malformed or would yield an invalid cost."""


class CalibrationError(ValueError):
    """No noise multiplier in the searchable range meets the target, or the inputs are invalid."""
