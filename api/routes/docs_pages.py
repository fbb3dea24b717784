"""/docs (Swagger UI) and /redoc served by this process: no CDN, a strict Content-Security-Policy.

FastAPI's own pages load their JavaScript and CSS from cdn.jsdelivr.net (a floating ``@5`` version)
and a favicon from fastapi.tiangolo.com: a third party could change the code running on a page
where users paste an API key, and the pages break offline. Here every asset comes from this
process: the unmodified Swagger UI 5 and ReDoc 2 builds shipped in the ``fastapi-offline`` wheel
(pinned in constraints.txt, so they change only with a deliberate bump), and a few lines of our
own start-up script. Nothing is inline, so the CSP allows scripts from 'self' only; Swagger UI's
online validator badge (a request to validator.swagger.io) is switched off.
"""

from __future__ import annotations

import html
import importlib.resources
from dataclasses import dataclass
from typing import Final

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from api.problems import Problem

__all__ = ["ASSETS_PATH", "DOCS_PATH", "REDOC_PATH", "install_docs_pages"]

DOCS_PATH: Final[str] = "/docs"
REDOC_PATH: Final[str] = "/redoc"
ASSETS_PATH: Final[str] = "/docs/assets"

_VENDOR = importlib.resources.files("fastapi_offline") / "static"
_SWAGGER_INIT = """\
"use strict";
window.addEventListener("DOMContentLoaded", function () {
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.dataset.openapiUrl,
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    validatorUrl: null,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
});
"""


@dataclass(frozen=True)
class _Asset:
    media_type: str
    vendor_file: str | None = None
    text: str | None = None

    def body(self) -> bytes:
        if self.vendor_file is not None:
            return (_VENDOR / self.vendor_file).read_bytes()
        assert self.text is not None
        return self.text.encode()


ASSETS: Final[dict[str, _Asset]] = {
    "swagger-ui-bundle.js": _Asset("text/javascript; charset=utf-8", vendor_file="swagger-ui-bundle.js"),
    "swagger-ui.css": _Asset("text/css; charset=utf-8", vendor_file="swagger-ui.css"),
    "redoc.standalone.js": _Asset("text/javascript; charset=utf-8", vendor_file="redoc.standalone.js"),
    "favicon.png": _Asset("image/png", vendor_file="favicon.png"),
    "swagger-init.js": _Asset("text/javascript; charset=utf-8", text=_SWAGGER_INIT),
}
"""The only files served under ASSETS_PATH: an allowlist, no directory listing or path walking."""

CONTENT_SECURITY_POLICY: Final[str] = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; worker-src blob:; form-action 'none'; base-uri 'none'; "
    "frame-ancestors 'none'"
)
"""Scripts from this origin only. Inline styles: Swagger UI sets style attributes and ReDoc injects
<style> elements. connect-src 'self': /openapi.json and "Try it out" calls. worker-src blob:
ReDoc builds its search index in a worker created from a blob URL."""

_PAGE_HEADERS: Final[dict[str, str]] = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def _swagger_page(*, title: str, openapi_url: str, assets: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} - Swagger UI</title>
<link rel="stylesheet" href="{assets}/swagger-ui.css">
<link rel="icon" href="{assets}/favicon.png">
</head>
<body>
<div id="swagger-ui" data-openapi-url="{html.escape(openapi_url)}"></div>
<script src="{assets}/swagger-ui-bundle.js"></script>
<script src="{assets}/swagger-init.js"></script>
</body>
</html>
"""


def _redoc_page(*, title: str, openapi_url: str, assets: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} - ReDoc</title>
<link rel="icon" href="{assets}/favicon.png">
</head>
<body>
<noscript>ReDoc needs JavaScript.</noscript>
<redoc spec-url="{html.escape(openapi_url)}"></redoc>
<script src="{assets}/redoc.standalone.js"></script>
</body>
</html>
"""


def install_docs_pages(app: FastAPI) -> None:
    """Add /docs, /redoc and their assets; create the app with docs_url=None, redoc_url=None."""
    openapi_url = app.openapi_url
    assert openapi_url is not None and app.docs_url is None and app.redoc_url is None

    def urls(request: Request) -> tuple[str, str]:
        root = request.scope.get("root_path", "").rstrip("/")
        return root + openapi_url, root + ASSETS_PATH

    @app.get(DOCS_PATH, include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        spec, assets = urls(request)
        return HTMLResponse(_swagger_page(title=app.title, openapi_url=spec, assets=assets), headers=_PAGE_HEADERS)

    @app.get(REDOC_PATH, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        spec, assets = urls(request)
        return HTMLResponse(_redoc_page(title=app.title, openapi_url=spec, assets=assets), headers=_PAGE_HEADERS)

    @app.get(ASSETS_PATH + "/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        found = ASSETS.get(name)
        if found is None:
            raise Problem(status=404, slug="not-found", detail=f"no documentation asset {name!r}")
        return Response(
            found.body(),
            media_type=found.media_type,
            headers={"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"},
        )
