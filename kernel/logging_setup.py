"""Structured JSON logging, configured by entry points only (never at import).

Records carry ids (job, dataset, tenant) through ``extra=``; private values never go into logs
(docs/privacy-model.md#worker-secrets), so the formatter has no way to print arbitrary objects beyond their ``str``.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_TERMINAL_ONLY = frozenset({"color_message"})
"""Extras meant for a terminal, dropped from JSON: uvicorn's ``color_message`` is its message again
with ANSI colour codes."""


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in _TERMINAL_ONLY and not key.startswith("_"):
                payload[key] = value if isinstance(value, int | float | bool | None) else str(value)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload)


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
