"""Liveness: whether the database answers."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from api.deps import StateDep
from api.schemas import HealthOut
from storage import StorageError

router = APIRouter(tags=["health"])
_logger = logging.getLogger(__name__)


@router.get("/health", response_model=HealthOut)
def health(state: StateDep) -> HealthOut:
    try:
        with state.repo().engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        storage = "ok" if state.schema_ready() else "ok (no tuner tables yet: no search has run)"
        status = "ok"
    except (StorageError, SQLAlchemyError) as exc:
        _logger.warning("health: storage unavailable: %s", exc)
        storage, status = f"unavailable: {str(exc).splitlines()[0][:200]}", "degraded"
    return HealthOut(status=status, storage=storage, control_enabled=state.settings.control_enabled)
