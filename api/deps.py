"""Dependencies as ``Annotated`` aliases, so route signatures read like prose."""

from __future__ import annotations

import hmac
import logging
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.settings import ApiSettings
from api.state import ApiState
from storage import Repo, Run

_logger = logging.getLogger(__name__)


# Dependencies that do no I/O are ``async def``: FastAPI runs a plain ``def`` dependency in the threadpool,
# which costs a thread hop per request for nothing. Those that query the database stay plain ``def``.


async def get_state(request: Request) -> ApiState:
    return request.app.state.api


StateDep = Annotated[ApiState, Depends(get_state)]


async def get_settings(state: StateDep) -> ApiSettings:
    return state.settings


SettingsDep = Annotated[ApiSettings, Depends(get_settings)]


async def get_repo(state: StateDep) -> Repo:
    return state.opened_repo() or await run_in_threadpool(state.repo)  # the first call connects


RepoDep = Annotated[Repo, Depends(get_repo)]

StudyName = Annotated[str, Path(min_length=1, max_length=255, description="the study name (Optuna's)")]


def get_run(name: StudyName, state: StateDep) -> Run:
    run = state.repo().get_run(name) if state.schema_ready() else None
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"study {name!r} not found")
    return run


RunDep = Annotated[Run, Depends(get_run)]

_bearer = HTTPBearer(auto_error=False, description="TUNER_API_CONTROL_TOKEN, as `Authorization: Bearer <token>`")


async def require_control(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """403 when control is off (no token configured); 401 when the bearer token is missing or wrong."""
    if settings.control_token is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, settings.control_disabled_reason())
    expected = settings.control_token.get_secret_value().encode()
    given = credentials.credentials.encode("utf-8", "surrogateescape") if credentials else b""
    if not credentials or not hmac.compare_digest(given, expected):
        _logger.warning("control request refused: %s bearer token", "wrong" if credentials else "missing")
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "a valid bearer token is required (Authorization: Bearer <TUNER_API_CONTROL_TOKEN>)",
            headers={"WWW-Authenticate": "Bearer"},
        )


ControlDep = Depends(require_control)
