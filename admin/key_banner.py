"""What ``privtrain-admin serve`` tells a person at start: where the service is and its API key.

Why a framed block: the key used to sit at the end of a one-line message, and the JSON log lines
that follow on stderr buried it. The block goes to stderr, next to those lines, once per start,
and is the only place the key is printed (the logs never carry it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

__all__ = ["framed", "print_start_banner", "start_banner"]

PADDING = 2


def framed(lines: Sequence[str]) -> str:
    """``lines`` in an ASCII frame (any terminal and log collector shows it as it is)."""
    width = max(len(line) for line in lines)
    border = "+" + "-" * (width + 2 * PADDING) + "+"
    body = [f"|{' ' * PADDING}{line.ljust(width)}{' ' * PADDING}|" for line in lines]
    return "\n".join([border, *body, border])


def start_banner(*, url: str, key: str | None, key_file: Path | None) -> str:
    """The block for a service at ``url``: the embedded mode's ``key`` and its file, or (key
    None) a pointer to the operator's own ``PRIVTRAIN_BOOTSTRAP_API_KEY``, never echoed."""
    lines = [f"privtrain is starting on {url}", ""]
    if key is not None:
        lines += ["API key (keep it secret):", "", f"    {key}", ""]
        if key_file is not None:
            lines.append(f"It is also in {key_file} (mode 0600).")
    else:
        lines.append("API key: the value of PRIVTRAIN_BOOTSTRAP_API_KEY.")
    lines += [
        f"Dashboard: {url}/ui (paste the key once to log in).",
        f"API: {url}/v1 with the header 'Authorization: Bearer <key>'.",
    ]
    return framed(lines)


def print_start_banner(stream: TextIO, *, url: str, key: str | None, key_file: Path | None) -> None:
    """Write the block with a blank line around it, flushed before the logs start."""
    stream.write("\n" + start_banner(url=url, key=key, key_file=key_file) + "\n\n")
    stream.flush()
