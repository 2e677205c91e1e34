"""/docs (Swagger UI) and /redoc without a CDN: their scripts come from the ``fastapi-offline`` package's files,
served here, so the API's documentation works on a machine with no internet (as the dashboard's plotly does)."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse

router = APIRouter(include_in_schema=False)

ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
"""swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js (mounted at /docs-assets by the app)."""
ASSETS_URL = "/docs-assets"


@router.get("/docs")
def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="tuner API",
        oauth2_redirect_url="/docs/oauth2-redirect",
        swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url="/favicon.ico",
    )


@router.get("/docs/oauth2-redirect")
def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
def redoc() -> HTMLResponse:
    return get_redoc_html(
        openapi_url="/openapi.json",
        title="tuner API",
        redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
        redoc_favicon_url="/favicon.ico",
        with_google_fonts=False,
    )
