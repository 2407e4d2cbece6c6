"""Swagger UI at /docs and ReDoc at /redoc, with every asset served by this process.

The assets come from the `fastapi-offline` package (MIT), which ships the Swagger UI
bundle and the ReDoc standalone script; nothing is fetched from a CDN, so the pages
work in an air-gapped cluster.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"


def asset_dir() -> Path:
    return Path(str(files("fastapi_offline") / "static"))


def add_docs(app: FastAPI) -> None:
    app.mount(ASSETS, StaticFiles(directory=asset_dir()), name="docs-assets")
    app.add_api_route("/docs", swagger_ui, include_in_schema=False)
    app.add_api_route("/redoc", redoc, include_in_schema=False)


# The pages read the app from the request: FastAPI keeps every endpoint it has analysed
# in a process-wide cache (4,096 of them), and an endpoint that closed over its app kept
# that app, its store engine and its caches alive long after it stopped (the tests and
# the twin make an app per run).
def swagger_ui(request: Request) -> HTMLResponse:
    url, title = _document(request)
    return get_swagger_ui_html(
        openapi_url=url,
        title=title,
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon.png",
    )


def redoc(request: Request) -> HTMLResponse:
    url, title = _document(request)
    return get_redoc_html(
        openapi_url=url,
        title=title,
        redoc_js_url=f"{ASSETS}/redoc.standalone.js",
        redoc_favicon_url=f"{ASSETS}/favicon.png",
        with_google_fonts=False,
    )


def _document(request: Request) -> tuple[str, str]:
    """The document a page shows, and its title, of the app serving the request."""
    return request.app.openapi_url or "/openapi.json", f"{request.app.title} API"
