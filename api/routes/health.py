"""Liveness: whether the database answers (GET or HEAD; 503 when it does not, so a load balancer can tell)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from api.deps import StateDep
from api.schemas import HealthOut
from storage import StorageError

router = APIRouter(tags=["health"])
_logger = logging.getLogger(__name__)


_DEGRADED = {503: {"model": HealthOut, "description": "degraded: the storage cannot be reached"}}


@router.head("/health", response_model=HealthOut, responses=_DEGRADED, operation_id="health_head")
@router.get("/health", response_model=HealthOut, responses=_DEGRADED, operation_id="health")
def health(state: StateDep, response: Response) -> HealthOut:
    try:
        with state.repo().engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        storage = "ok" if state.schema_ready() else "ok (no tuner tables yet: no search has run)"
        status = "ok"
    except (StorageError, SQLAlchemyError) as exc:
        _logger.warning("health: storage unavailable: %s", exc)
        storage, status = f"unavailable: {str(exc).splitlines()[0][:200]}", "degraded"
        response.status_code = 503
    return HealthOut(status=status, storage=storage, control_enabled=state.settings.control_enabled)
