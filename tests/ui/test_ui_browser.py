"""The dashboard in a real headless Chromium, driven by Playwright, against a live uvicorn server:
a person logs in through the form (types the key, clicks "Log in"), clicks through datasets, a
dataset's ledger, a job followed live over EventSource, its report; cancels a queued job with its
button; accepts an invitation; logs out. Every page runs under its real CSP: a blocked script or
any console error fails the test.

Chromium: ``PRIVTRAIN_TEST_CHROMIUM``, else the first of ``BROWSERS`` on PATH (Debian's
``chromium`` package; Playwright drives it, it downloads no browser of its own). Without a
Chromium or without Playwright these tests skip locally and FAIL under ``CI=true`` (.ci/run
installs Chromium). One browser per module, a fresh context (cookie jar) per test.
Set PRIVTRAIN_UPDATE_SCREENSHOTS=1 to refresh docs/screenshots/*.png from this run.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from sqlalchemy import update

from api.routes.ui_session import COOKIE_NAME
from kernel.db.orm import Job, utcnow
from kernel.jobs import lifecycle
from kernel.jobs.events import add_job_event
from tests.live_app import serving
from tests.ui.conftest import UiWorld, built_world

try:
    from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright
except ImportError:  # reported by the `browser` fixture: a skip locally, a failure under CI=true
    sync_playwright = None

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
VIEWPORT = {"width": 1200, "height": 800}


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}: browser tests may not skip when CI=true (.ci/run installs Chromium)")
    pytest.skip(reason)


def _chromium_path() -> str | None:
    configured = os.environ.get("PRIVTRAIN_TEST_CHROMIUM")
    if configured:
        return configured if Path(configured).exists() else None
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


@pytest.fixture(scope="module", autouse=True)
def chromium() -> str:
    """The browser binary; checked before any other fixture builds anything."""
    path = _chromium_path()
    if path is None:
        _unavailable("no Chromium/Chrome binary found (apt-get install chromium, or set PRIVTRAIN_TEST_CHROMIUM)")
    if sync_playwright is None:
        _unavailable("Playwright is not installed (pip install -c constraints.txt -e '.[dev]')")
    return path


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
        )
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def demo_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiWorld]:
    """Its own world with a plain dataset name, so the screenshots read like real use."""
    with built_world(tmp_path_factory.mktemp("ui-demo"), dataset_name="credit-scoring (demo)") as world:
        yield world


@pytest.fixture(scope="module")
def live_url(demo_world: UiWorld) -> Iterator[str]:
    with serving(demo_world.app) as url:
        yield url


class _Problems:
    """Console errors (CSP violations are reported there) and uncaught script errors of a page."""

    def __init__(self, page: Page) -> None:
        self.seen: list[str] = []
        self.allowed: list[str] = []
        page.on("console", lambda message: self.seen.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: self.seen.append(f"uncaught: {error}"))

    def allow(self, text: str) -> None:
        """A console error the test causes on purpose (one occurrence each)."""
        self.allowed.append(text)

    def unexpected(self) -> list[str]:
        left = list(self.seen)
        for text in self.allowed:
            if text in left:
                left.remove(text)
        return left


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(10_000)
    yield context
    context.close()


@pytest.fixture
def page_and_problems(context: BrowserContext) -> Iterator[tuple[Page, _Problems]]:
    page = context.new_page()
    problems = _Problems(page)
    yield page, problems
    assert problems.unexpected() == [], problems.seen


@pytest.fixture
def page(page_and_problems: tuple[Page, _Problems]) -> Page:
    return page_and_problems[0]


@pytest.fixture
def problems(page_and_problems: tuple[Page, _Problems]) -> _Problems:
    return page_and_problems[1]


def _log_in(page: Page, live_url: str, key: str) -> None:
    """What a person does: open the dashboard, paste the key, press "Log in"."""
    page.goto(f"{live_url}/ui")
    expect(page).to_have_url(f"{live_url}/ui/login")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{live_url}/ui/datasets")


def _start_running(world: UiWorld, job_id: str, *, step: int, spent: float) -> None:
    """What the worker writes when it starts a job and reports a step (no training runs)."""
    with world.db.write_transaction() as tx:
        job = tx.get(Job, job_id)
        assert job is not None and job.status == "queued"
        tx.execute(
            update(Job).where(Job.id == job_id).values(status="running", attempt=1, started_at=utcnow(), steps_run=step)
        )
        add_job_event(tx, job_id, "started", {"attempt": 1, "steps_planned": job.steps_planned})
        add_job_event(
            tx, job_id, "progress", {"step": step, "steps_planned": job.steps_planned, "epsilon_spent": spent}
        )


def _bar_shares(page: Page, row: Any) -> tuple[float, float]:
    """The drawn (committed, reserved) widths of a row's gauge, as fractions of the whole bar."""
    return row.locator(".gauge").evaluate(
        "bar => [bar.querySelector('.committed').getBoundingClientRect().width / bar.getBoundingClientRect().width,"
        " bar.querySelector('.reserved').getBoundingClientRect().width / bar.getBoundingClientRect().width]"
    )


def test_log_in_through_the_form_and_click_through_to_the_report(
    demo_world: UiWorld,
    live_url: str,
    page: Page,
    problems: _Problems,
) -> None:
    problems.allow("Failed to load resource: the server responded with a status of 401 (Unauthorized)")
    page.goto(f"{live_url}/ui")
    page.get_by_label("API key").fill("pt_not-a-key")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#login-error")).to_contain_text("unknown or revoked")
    _log_in(page, live_url, demo_world.alice_key)  # the form that answered 403 in Chromium before

    budget = demo_world.client(demo_world.alice_key).get(f"/v1/datasets/{demo_world.dataset_id}/budget").json()
    row = page.locator(f'tr[data-dataset-id="{demo_world.dataset_id}"]')
    committed, reserved = _bar_shares(page, row)
    free = 1 - committed - reserved
    assert free == pytest.approx(budget["remaining_epsilon"] / budget["epsilon"], abs=0.01), (
        "the bar's empty part is what a new job can get"
    )

    row.get_by_role("link", name="credit-scoring (demo)").click()
    expect(page.locator("#dataset-name")).to_have_text("credit-scoring (demo)")
    expect(page.locator("#plot-ledger svg")).to_be_visible()
    assert page.locator("#ledger-entries tr[data-seq]").count() == budget["entries"]

    page.locator(f'#dataset-jobs a[href="/ui/jobs/{demo_world.job_id}"]').click()
    expect(page.locator("#job .status")).to_have_text("succeeded")
    expect(page.locator("#event-log tr").first).to_contain_text("Finished 30 steps; ε charged")
    page.get_by_role("link", name="open the HTML report").click()
    expect(page).to_have_url(f"{live_url}/ui/jobs/{demo_world.job_id}/report")
    expect(page.locator("#epsilon-ledger")).to_be_visible()
    assert page.locator("svg").count() == 3


def test_a_job_page_follows_the_job_live(demo_world: UiWorld, live_url: str, page: Page) -> None:
    """Status, step, progress bar, ε so far and the event list change over EventSource while the
    page stays loaded; when the job ends, the page reloads with its final figures."""
    job_id = demo_world.submit_job(demo_world.alice_key, dataset_id=demo_world.dataset_id)
    _log_in(page, live_url, demo_world.alice_key)
    page.goto(f"{live_url}/ui/jobs/{job_id}")
    expect(page.locator("#job .status")).to_have_text("queued")
    page.evaluate("window.stillTheSamePage = true")

    _start_running(demo_world, job_id, step=7, spent=0.91234)
    expect(page.locator("#job .status")).to_have_text("running")
    expect(page.locator("#job .steps")).to_have_text("7")
    assert page.locator("progress.steps-bar").evaluate("bar => bar.value") == 7
    expect(page.locator(".epsilon-spent")).to_have_text("0.9124")  # rounded up, never down
    expect(page.locator("#event-log tr").first).to_have_text(
        re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s*progress\s*Step 7 of 10 done; ε spent so far 0\.9124\.")
    )
    assert page.evaluate("window.stillTheSamePage") is True, "updated in place, not reloaded"

    assert lifecycle.fail(  # the worker gives up before opening the data
        demo_world.db,
        attempt=lifecycle.Attempt(job_id=job_id, dataset_id=demo_world.dataset_id, number=1),
        error_code="worker-gave-up",
        actor="worker:demo",
    )
    expect(page.locator("#job .status")).to_have_text("failed")
    expect(page.locator("#job")).to_contain_text("ε committed (what this job spent)")
    assert page.evaluate("window.stillTheSamePage") is None, "reloaded for the final figures"
    assert page.locator("form.cancel-form").count() == 0


def test_cancel_a_queued_job_with_its_button(demo_world: UiWorld, live_url: str, page: Page) -> None:
    _log_in(page, live_url, demo_world.alice_key)
    page.get_by_role("link", name="Jobs").click()
    page.locator(f'tr[data-job-id="{demo_world.queued_job_id}"] a[href="/ui/jobs/{demo_world.queued_job_id}"]').click()
    expect(page.locator("#job .status")).to_have_text("queued")
    page.get_by_role("button", name="Cancel job").click()
    expect(page).to_have_url(f"{live_url}/ui/jobs/{demo_world.queued_job_id}")
    expect(page.locator("#job .status")).to_have_text("cancelled")
    expect(page.locator("#event-log tr").first).to_contain_text("Cancelled after 0 steps.")
    assert page.get_by_role("button", name="Cancel job").count() == 0
    job = demo_world.client(demo_world.alice_key).get(f"/v1/jobs/{demo_world.queued_job_id}").json()
    assert job["status"] == "cancelled"


def test_accept_an_invitation_with_a_click(demo_world: UiWorld, live_url: str, page: Page) -> None:
    dataset_id = demo_world.upload_dataset(demo_world.bob_key, name="bob's churn data")
    demo_world.invite(demo_world.bob_key, dataset_id=dataset_id, tenant="alice")
    _log_in(page, live_url, demo_world.alice_key)
    invitation = page.locator(f'#invitations tr[data-invitation="{dataset_id}"]')
    expect(invitation).to_contain_text("bob's churn data")
    invitation.get_by_role("button", name="Accept").click()
    expect(page).to_have_url(f"{live_url}/ui/datasets")
    expect(page.locator(f'tr[data-invitation="{dataset_id}"]')).to_have_count(0)
    expect(page.locator(f'tr[data-dataset-id="{dataset_id}"]')).to_contain_text("shared by bob")


def test_log_out_ends_the_session_for_every_copy_of_the_cookie(
    demo_world: UiWorld,
    live_url: str,
    context: BrowserContext,
    page: Page,
) -> None:
    _log_in(page, live_url, demo_world.alice_key)
    (session_cookie,) = [c for c in context.cookies() if c["name"] == COOKIE_NAME]
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(f"{live_url}/ui/login")
    page.goto(f"{live_url}/ui/datasets")
    expect(page).to_have_url(f"{live_url}/ui/login")
    context.add_cookies([session_cookie])  # the cookie copied before logout
    page.goto(f"{live_url}/ui/datasets")
    expect(page).to_have_url(f"{live_url}/ui/login")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()


def test_screenshots_of_the_pages_people_use(demo_world: UiWorld, live_url: str, page: Page, tmp_path: Path) -> None:
    """Renders each page in Chromium and, with PRIVTRAIN_UPDATE_SCREENSHOTS=1, refreshes the
    screenshots of docs/reports-and-dashboard.md: a running job, a pending invitation, the ledger, the report."""
    running = demo_world.submit_job(demo_world.alice_key, dataset_id=demo_world.dataset_id)
    _start_running(demo_world, running, step=6, spent=0.84)
    offered = demo_world.upload_dataset(demo_world.bob_key, name="bob's fraud labels")
    demo_world.invite(demo_world.bob_key, dataset_id=offered, tenant="alice")
    page.goto(f"{live_url}/ui/login")
    shots = {"login": None}
    _screenshot(page, tmp_path / "login.png")
    page.get_by_label("API key").fill(demo_world.alice_key)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(f"{live_url}/ui/datasets")
    shots.update(
        {
            "datasets": "/ui/datasets",
            "ledger": f"/ui/datasets/{demo_world.dataset_id}",
            "jobs": "/ui/jobs",
            "job": f"/ui/jobs/{running}",
            "report": f"/ui/jobs/{demo_world.job_id}/report",
        }
    )
    for name, path in shots.items():
        if path is not None:
            page.goto(live_url + path)
            if name in ("jobs", "job"):
                expect(page.locator(f'[data-job-id="{running}"] .status')).to_have_text("running")
            _screenshot(page, tmp_path / f"{name}.png")
    if os.environ.get("PRIVTRAIN_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        for name in shots:
            shutil.copyfile(tmp_path / f"{name}.png", SCREENSHOTS / f"ui_{name}.png")


def _screenshot(page: Page, target: Path) -> None:
    page.screenshot(path=str(target), full_page=True)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and target.stat().st_size > 10_000
