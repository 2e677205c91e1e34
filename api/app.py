"""The FastAPI application: ``create_app(settings)`` is what ``tuner serve`` runs."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import SQLAlchemyError

from api.routes import (
    artifacts,
    control,
    dashboard,
    docs,
    events,
    health,
    studies,
    trials,
)
from api.settings import ApiSettings
from api.state import ApiState
from storage import StorageError

_logger = logging.getLogger(__name__)


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    """Build the app; nothing touches the database until the first request."""
    settings = settings or ApiSettings()
    settings.log_control_state()
    state = ApiState(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        state.close()

    app = FastAPI(
        title="tuner",
        summary="Trial status, best configurations and live events of tuner searches.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # api.routes.docs serves /docs and /redoc with local scripts (no CDN)
        redoc_url=None,
    )
    app.state.api = state
    for module in (health, studies, trials, artifacts, events, control, dashboard, docs):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=dashboard.STATIC_DIR), name="static")
    app.mount(docs.ASSETS_URL, StaticFiles(directory=docs.ASSETS_DIR), name="docs-assets")

    @app.exception_handler(StorageError)
    @app.exception_handler(SQLAlchemyError)
    async def storage_unavailable(_request: Request, exc: Exception) -> JSONResponse:
        _logger.error("storage error: %s", exc)
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        return JSONResponse({"detail": f"storage unavailable: {reason}"}, status.HTTP_503_SERVICE_UNAVAILABLE)

    return app
