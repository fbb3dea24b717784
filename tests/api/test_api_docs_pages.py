"""/docs and /redoc load nothing from a third party (security review item 14: FastAPI's pages
pulled their JavaScript from cdn.jsdelivr.net), their assets answer from this process, and the
Content-Security-Policy set on them still lets Swagger UI and ReDoc render (checked in a real
headless Chromium when one is installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from kernel.config import Settings
from tests.conftest import RecordingDispatcher
from tests.live_app import serving

PAGES = ("/docs", "/redoc")
ORIGIN = "http://testserver"
BROWSER = next(
    (path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None
)


class _References(HTMLParser):
    """Every URL-valued attribute, and whether any <script> carries inline code."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.inline_scripts = 0
        self._in_script_without_src = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        self.urls += [value for name, value in attrs if name in ("src", "href", "spec-url", "action") and value]
        self.urls += [value for name, value in attrs if name.startswith("data-") and value and "/" in value]
        self._in_script_without_src = tag == "script" and not values.get("src")

    def handle_data(self, data: str) -> None:
        if self._in_script_without_src and data.strip():
            self.inline_scripts += 1

    def handle_endtag(self, tag: str) -> None:
        self._in_script_without_src = False


def _references(html: str) -> _References:
    parser = _References()
    parser.feed(html)
    return parser


@pytest.mark.parametrize("page", PAGES)
def test_docs_pages_reference_only_their_own_origin(app_client: TestClient, page: str) -> None:
    response = app_client.get(page)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert not set(re.findall(r"https?://[^\s\"'<>)]+", response.text)), "an absolute URL on the page"
    refs = _references(response.text)
    assert refs.urls and all(url.startswith("/") and not url.startswith("//") for url in refs.urls), refs.urls
    assert refs.inline_scripts == 0  # so the CSP needs no 'unsafe-inline' for scripts
    for url in refs.urls:
        asset = app_client.get(url)
        assert asset.status_code == 200, url
        assert "cdn.jsdelivr.net" not in asset.text[:2000] if url.endswith(".js") else True


@pytest.mark.parametrize("page", PAGES)
def test_docs_pages_have_a_strict_csp(app_client: TestClient, page: str) -> None:
    policy = app_client.get(page).headers["content-security-policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'"  # no inline, no eval, no other origin
    assert "http" not in policy


def test_unknown_assets_are_404_problems_not_files(app_client: TestClient) -> None:
    for name in ("nope.js", "..%2Fcore.py", "%2E%2E%2F%2E%2E%2Fapp%2Fmain.py"):
        response = app_client.get(f"/docs/assets/{name}")
        assert response.status_code == 404 and response.headers["content-type"] == "application/problem+json"


def test_openapi_json_is_still_served(app_client: TestClient) -> None:
    assert app_client.get("/openapi.json").json()["openapi"].startswith("3.1")


# ---------------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from kernel.bootstrap import migrate
    from tests.conftest import make_settings

    settings: Settings = make_settings(tmp_path_factory.mktemp("docs") / "data")
    migrate(settings)
    with serving(create_app(settings, dispatcher=RecordingDispatcher())) as url:
        yield url


def _rendered(url: str) -> tuple[str, str]:
    """(DOM after the page's scripts ran, Chromium's console log) of one page load."""
    assert BROWSER is not None
    command = [
        BROWSER,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=15000",
        "--dump-dom",
        url,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, result.stderr


def _blocked_by_csp(console: str) -> list[str]:
    """The URL each CSP violation names ('' for a violation without one, e.g. an inline script)."""
    blocked = []
    for line in console.splitlines():
        if "Content Security Policy" in line:
            urls = re.findall(r"'(https?://[^']+)'", line)
            blocked.append(urls[0] if urls else "")
    return blocked


@pytest.mark.skipif(BROWSER is None, reason="no Chromium/Chrome binary found")
@pytest.mark.parametrize(("page", "rendered_marker"), [("/docs", 'class="opblock'), ("/redoc", "/v1/jobs/estimate")])
def test_docs_pages_render_under_their_csp_in_chromium(live_url: str, page: str, rendered_marker: str) -> None:
    """The CSP lets everything of ours run; the only thing it stops is ReDoc's bundled attempt to
    show Redocly's logo from cdn.redoc.ly (the image then hides itself), so no request leaves."""
    dom, console = _rendered(live_url + page)
    assert rendered_marker in dom, dom[:2000]  # the operations were rendered from /openapi.json
    blocked = _blocked_by_csp(console)
    assert all(url and not url.startswith(live_url) for url in blocked), console[-3000:]
    assert set(blocked) <= ({"https://cdn.redoc.ly/redoc/logo-mini.svg"} if page == "/redoc" else set())
