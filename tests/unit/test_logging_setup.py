"""The service's log lines: plain JSON, one object per line, extras kept and terminal decorations dropped."""

from __future__ import annotations

import json
import logging

from kernel.logging_setup import JsonFormatter


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Started server process [%d]", (42,), None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_uvicorns_coloured_message_is_dropped_and_the_line_is_one_json_object() -> None:
    """uvicorn passes ``color_message`` (the message with ANSI codes) as an extra; JSON logs never carry it."""
    line = JsonFormatter().format(_record(color_message="Started server process [\x1b[36m%d\x1b[0m]", job_id="job_1"))
    assert "\n" not in line and "\x1b" not in line
    payload = json.loads(line)
    assert payload["msg"] == "Started server process [42]" and payload["job_id"] == "job_1"
    assert "color_message" not in payload and payload["logger"] == "uvicorn.error" and payload["level"] == "INFO"
