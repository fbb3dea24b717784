"""The API key that `privtrain-admin serve` prints at start stands out from the log lines: a
framed block on stderr, once per start, and nowhere else (not on stdout, not in a log line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from admin.cli import main
from admin.key_banner import framed, start_banner
from kernel.config import get_settings


@pytest.fixture
def serve_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`serve` against a fresh data dir, with uvicorn and the logging setup stubbed out (the
    test is about what is printed before the server runs)."""
    data_dir = tmp_path / "data"
    monkeypatch.setenv("PRIVTRAIN_DATA_DIR", str(data_dir))
    monkeypatch.setenv("PRIVTRAIN_ENVIRONMENT", "test")
    for name in ("PRIVTRAIN_DATABASE_URL", "PRIVTRAIN_BROKER_URL", "PRIVTRAIN_BOOTSTRAP_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("uvicorn.run", lambda *args, **kwargs: None)
    monkeypatch.setattr("admin.cli.configure_logging", lambda level: None)
    get_settings.cache_clear()
    yield data_dir
    get_settings.cache_clear()


def _frame_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("+", "|"))]


def test_framed_lines_share_one_width() -> None:
    block = framed(["short", "a somewhat longer line", ""])
    lines = block.splitlines()
    assert len({len(line) for line in lines}) == 1
    assert lines[0] == lines[-1] and set(lines[0]) == {"+", "-"}
    assert all(line.startswith("|") and line.endswith("|") for line in lines[1:-1])


def test_serve_prints_the_key_once_in_a_frame_on_stderr(serve_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--no-worker", "--port", "8123"]) == 0
    out, err = capsys.readouterr()
    key = (serve_env / "api-key").read_text().strip()
    assert key not in out
    assert err.count(key) == 1
    frame = _frame_lines(err)
    assert frame[0].startswith("+--") and frame[-1] == frame[0]
    assert any(key in line for line in frame), "the key is inside the frame"
    assert len({len(line) for line in frame}) == 1
    assert "http://127.0.0.1:8123/ui" in err and str(serve_env / "api-key") in err

    assert main(["serve", "--no-worker", "--port", "8123"]) == 0  # the next start: the same key, again once
    assert capsys.readouterr().err.count(key) == 1


def test_an_operators_own_key_is_never_echoed(
    serve_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "pt_operator-chosen-secret-key-0123456789abcdef"
    monkeypatch.setenv("PRIVTRAIN_BOOTSTRAP_API_KEY", secret)
    get_settings.cache_clear()
    assert main(["serve", "--no-worker"]) == 0
    out, err = capsys.readouterr()
    assert secret not in out + err
    assert "PRIVTRAIN_BOOTSTRAP_API_KEY" in "".join(_frame_lines(err))


def test_the_banner_text() -> None:
    text = start_banner(url="http://h:1", key="pt_k", key_file=Path("/d/api-key"))
    assert "    pt_k" in text and "/d/api-key (mode 0600)" in text and "http://h:1/ui" in text
