"""The refusals of a text (JSON Lines) upload, each with a stable problem type."""

from __future__ import annotations

from typing import Literal, get_args

TextReason = Literal[
    "jsonl-invalid-line",
    "jsonl-missing-field",
    "jsonl-bad-field",
    "jsonl-line-too-long",
    "jsonl-too-many-records",
    "jsonl-empty",
    "text-not-utf8",
    "bad-text-options",
    "unknown-text-task",
    "token-array-too-large",
]

TEXT_REASONS: tuple[TextReason, ...] = get_args(TextReason)


class TextValidationError(ValueError):
    """A text upload the service refuses.

    ``reason`` is the problem type the API answers with; ``detail`` names the line, never its
    text, because the texts are the private data (details reach responses and logs).
    """

    reason: TextReason
    detail: str

    def __init__(self, reason: TextReason, detail: str) -> None:
        if reason not in TEXT_REASONS:
            raise ValueError(f"unknown text validation reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self) -> tuple[type[TextValidationError], tuple[TextReason, str]]:
        """Rebuild from (reason, detail) so the error survives pickling across processes."""
        return (type(self), (self.reason, self.detail))
