"""Exceptions of the privacy package; both are ValueErrors so callers can map them to HTTP 4xx."""

from __future__ import annotations


class PrivacyEventError(ValueError):
    """An event, curve or privacy parameter is malformed or would yield an invalid cost."""


class CalibrationError(ValueError):
    """No noise multiplier in the searchable range meets the target, or the inputs are invalid."""


class UnsupportedEvent(PrivacyEventError):
    """An accountant was given an event outside its model (dp-accounting's UnsupportedEventError).

    The one answer to "this accountant cannot price this event", whichever accountant is asked:
    callers choose an accountant by asking ``supports`` and never by the event's kind. A
    PrivacyEventError, so the API refuses it as a malformed event like any other."""

    def __init__(self, *, accountant: str, event: object, reason: str) -> None:
        super().__init__(f"the {accountant} accountant does not support {_describe(event)}: {reason}")
        self.accountant = accountant
        self.event = event
        self.reason = reason


class AccountantFailed(PrivacyEventError):
    """A supported event the accountant could not price with a trustworthy number here (its
    numerics failed, δ is below its range, a count is over its limit): another accountant may."""


def _describe(event: object) -> str:
    kind = getattr(type(event), "KIND", None)
    return f"a {kind!r} event" if isinstance(kind, str) else f"{type(event).__name__} (not a privacy event)"
