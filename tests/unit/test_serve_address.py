"""Where `privtrain-admin serve` listens: PRIVTRAIN_HOST/PRIVTRAIN_PORT, overridden by --host/--port,
both shown in --help."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import uvicorn

from admin.cli import build_parser, main
from kernel.config import get_settings


def _served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *argv: str, **env: str) -> dict[str, Any]:
    """serve's uvicorn.run arguments (nothing is started: no worker, uvicorn.run replaced)."""
    monkeypatch.setenv("PRIVTRAIN_DATA_DIR", str(tmp_path / "data"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(kwargs))
    get_settings.cache_clear()  # the process's settings are read once: read them from this environment
    try:
        assert main(["serve", "--no-worker", *argv]) == 0
    finally:
        get_settings.cache_clear()
    return seen


def test_the_address_comes_from_the_settings_and_the_flags_override_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _served(monkeypatch, tmp_path) | {} == {"host": "127.0.0.1", "port": 8000, "log_config": None}
    chosen = _served(monkeypatch, tmp_path, PRIVTRAIN_HOST="0.0.0.0", PRIVTRAIN_PORT="8123")
    assert (chosen["host"], chosen["port"]) == ("0.0.0.0", 8123)
    assert "http://0.0.0.0:8123" in capsys.readouterr().err  # the start banner names it
    flagged = _served(monkeypatch, tmp_path, "--port", "9001", PRIVTRAIN_PORT="8123")
    assert flagged["port"] == 9001


def test_serve_help_names_both_settings() -> None:
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    text = serve.format_help()
    assert "PRIVTRAIN_HOST" in text and "PRIVTRAIN_PORT" in text and "0.0.0.0" in text
