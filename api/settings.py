"""The API's settings: one pydantic ``BaseSettings`` read from ``TUNER_API_*`` environment variables.

Control endpoints (start and stop a search) are off unless ``control_token`` is set; a token that is too short
or a known placeholder is refused at start-up rather than silently accepted.
"""

from __future__ import annotations

import ipaddress
import logging
import sys
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

_logger = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16
_PLACEHOLDER_TOKENS = {"changethis", "changeme", "secret", "token", "password", "admin"}


def is_loopback(host: str) -> bool:
    """True for ``127.0.0.1``, ``::1``, ``localhost`` and the rest of 127/8; False for ``0.0.0.0`` or a name."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ApiSettings(BaseSettings):
    """Settings of ``tuner serve``; every field can be given as ``TUNER_API_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="TUNER_API_", extra="ignore")

    storage_url: str = "sqlite:///tuner.db"
    """The database the search writes (Optuna's tables and the ``tuner_`` tables)."""
    control_token: SecretStr | None = None
    """Bearer token that enables ``POST /api/searches`` and ``POST /api/studies/{name}/stop``; unset = off."""
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    search_command: list[str] = Field(default_factory=lambda: [sys.executable, "-m", "tuner"])
    """argv prefix of the tuner CLI (``search --budget ...`` is appended); default: this interpreter's."""
    search_out_dir: Path = Path("tuner-out")
    """Searches started through the API export to ``<search_out_dir>/<study>/`` and log to ``search.log`` there."""
    derived_refresh_s: float = Field(default=5.0, ge=0, le=3600)
    """Importances and plots of a study that changed are recomputed at most this often (or 10x their cost)."""
    sse_poll_s: float = Field(default=0.5, gt=0, le=10)
    sse_max_s: float = Field(default=3600.0, gt=0)
    """A live stream is closed after this long; the browser's EventSource reconnects with Last-Event-ID."""

    @field_validator("control_token")
    @classmethod
    def _refuse_weak_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is None:
            return None
        value = token.get_secret_value()
        if value == "":
            return None
        if value.strip().lower() in _PLACEHOLDER_TOKENS or len(value) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"`control_token` must be at least {MIN_TOKEN_CHARS} characters and not a placeholder, "
                f"but got one of {len(value)} characters; generate one with "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )
        return token

    @property
    def control_enabled(self) -> bool:
        return self.control_token is not None

    def control_disabled_reason(self) -> str:
        """Why control is off, or ``""`` when it is on."""
        if self.control_token is None:
            return "control disabled: set TUNER_API_CONTROL_TOKEN"
        return ""

    def log_control_state(self) -> None:
        if self.control_token is None and not is_loopback(self.host):
            _logger.warning(
                "serving on non-loopback host %r without a control token: starting and stopping searches is "
                "refused (403); set TUNER_API_CONTROL_TOKEN to enable it",
                self.host,
            )
        elif self.control_token is None:
            _logger.info("control endpoints disabled: set TUNER_API_CONTROL_TOKEN to enable them")
        else:
            _logger.info("control endpoints enabled (bearer token required)")
