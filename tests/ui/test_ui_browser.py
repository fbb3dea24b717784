"""The dashboard and the HTML report in a real headless Chromium against a live uvicorn server.

Skipped (with the reason) when no Chromium/Chrome binary is installed, as on a bare CI runner.
Chromium's command line cannot fill a form, so the test server adds the session cookie that the
login form would have set (the form itself is tested in test_ui_auth.py); everything else — the
CSP, the nonce'd script, EventSource with the cookie, the inline SVG — runs in the browser.
Set PRIVTRAIN_UPDATE_SCREENSHOTS=1 to refresh docs/screenshots/*.png from this run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from app.api.ui_session import COOKIE_NAME, encode_session, new_session, session_secret
from app.auth import key_digest
from app.job_views import add_job_event
from app.models import Job
from tests.ui.conftest import UiWorld, built_world
from tests.ui.html_probe import parse, text_of

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


def _browser() -> str | None:
    configured = os.environ.get("PRIVTRAIN_TEST_CHROMIUM")
    if configured:
        return configured if Path(configured).exists() else None
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


BROWSER = _browser()
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium/Chrome binary found (set PRIVTRAIN_TEST_CHROMIUM)")


class _CookieAsBrowserLogin:
    """ASGI wrapper: requests without a cookie get the session cookie the login form sets."""

    def __init__(self, app, cookie: str) -> None:  # type: ignore[no-untyped-def]
        self.app, self.cookie = app, cookie.encode()

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] == "http" and scope["path"].startswith("/ui"):
            headers = [(k, v) for k, v in scope["headers"] if k != b"cookie"]
            scope = dict(scope, headers=[*headers, (b"cookie", self.cookie)])
        await self.app(scope, receive, send)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def demo_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiWorld]:
    """Its own world with a plain dataset name, so the screenshots read like real use."""
    with built_world(tmp_path_factory.mktemp("ui-demo"), dataset_name="credit-scoring (demo)") as world:
        yield world


@pytest.fixture(scope="module")
def live_url(demo_world: UiWorld) -> Iterator[str]:
    ui_world = demo_world
    session = new_session(key_digest(ui_world.alice_key))
    cookie = f"{COOKIE_NAME}={encode_session(session, session_secret(ui_world.settings))}"
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(_CookieAsBrowserLogin(ui_world.app, cookie), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def _chromium(*args: str, timeout: float = 60) -> str:
    assert BROWSER is not None
    command = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--hide-scrollbars", "--no-first-run", "--disable-extensions", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _screenshot(url: str, target: Path, *, height: int) -> None:
    _chromium(f"--screenshot={target}", f"--window-size=1200,{height}", url)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and target.stat().st_size > 10_000


def test_live_status_arrives_by_event_source(demo_world: UiWorld, live_url: str) -> None:
    """The queued job's row is rendered as queued with 0 steps; events written afterwards (a
    worker starting it and reporting step 7) reach the page only through EventSource — with the
    cookie, past the CSP — and the script rewrites the row."""
    ui_world = demo_world
    with ui_world.db.write_transaction() as tx:
        job = tx.get(Job, ui_world.queued_job_id)
        assert job is not None and job.status == "queued"
        add_job_event(tx, job.id, "started", {"attempt": 1, "steps_planned": job.steps_planned})
        add_job_event(tx, job.id, "progress", {"step": 7, "steps_planned": job.steps_planned})
    dom = _chromium("--virtual-time-budget=4000", "--dump-dom", f"{live_url}/ui/jobs")
    page = parse(dom)
    (row,) = page.with_attr("data-job-id", ui_world.queued_job_id)
    status = [e for e in page.inside(row) if e.attrs.get("class", "").startswith("status")][0]
    steps = [e for e in page.inside(row) if e.attrs.get("class") == "steps"][0]
    assert text_of(status) == "running" and status.attrs["class"] == "status status-running"
    assert text_of(steps) == "7"


def test_report_and_dashboard_render_in_chromium(demo_world: UiWorld, live_url: str, tmp_path: Path) -> None:
    ui_world = demo_world
    pages = {
        "report": (f"/ui/jobs/{ui_world.job_id}/report", 3000),
        "datasets": ("/ui/datasets", 700),
        "ledger": (f"/ui/datasets/{ui_world.dataset_id}", 1500),
        "jobs": ("/ui/jobs", 600),
    }
    dom = _chromium("--dump-dom", f"{live_url}/ui/jobs/{ui_world.job_id}/report")
    rendered = parse(dom)
    assert len(rendered.tags("svg")) == 3 and rendered.by_id("epsilon-ledger").attrs["data-value"]
    for name, (path, height) in pages.items():
        target = tmp_path / f"{name}.png"
        _screenshot(live_url + path, target, height=height)
        if os.environ.get("PRIVTRAIN_UPDATE_SCREENSHOTS") == "1":
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(target, SCREENSHOTS / f"ui_{name}.png")
