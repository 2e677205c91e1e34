"""ApiSettings: environment prefix, refusal of weak tokens, control off by default and on public hosts."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

from api.app import create_app
from api.settings import ApiSettings, is_loopback


def test_defaults_and_env_prefix(monkeypatch) -> None:
    s = ApiSettings()
    assert s.storage_url == "sqlite:///tuner.db" and s.control_token is None and s.host == "127.0.0.1"
    monkeypatch.setenv("TUNER_API_STORAGE_URL", "sqlite:///other.db")
    monkeypatch.setenv("TUNER_API_CONTROL_TOKEN", "x" * 32)
    monkeypatch.setenv("TUNER_API_HOST", "0.0.0.0")
    s = ApiSettings()
    assert s.storage_url == "sqlite:///other.db" and s.control_enabled and s.host == "0.0.0.0"
    assert "x" * 32 not in repr(s)  # the token never shows in logs or reprs


@pytest.mark.parametrize("token", ["changethis", "short", "password", "admin"])
def test_weak_tokens_are_refused(token: str) -> None:
    with pytest.raises(ValidationError, match="control_token"):
        ApiSettings(control_token=token)


def test_empty_token_means_control_off() -> None:
    assert ApiSettings(control_token="").control_token is None


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                                ("127.0.0.2", True), ("0.0.0.0", False), ("10.1.2.3", False),
                                                ("example.org", False), ("::", False)])  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_public_host_without_token_refuses_control_and_logs_it(caplog, tmp_path) -> None:
    from fastapi.testclient import TestClient

    with caplog.at_level(logging.WARNING, logger="api.settings"):
        app = create_app(ApiSettings(storage_url=f"sqlite:///{tmp_path / 'x.db'}", host="0.0.0.0"))
    assert any("non-loopback" in r.message and "refused" in r.message for r in caplog.records)
    with TestClient(app) as c:
        assert c.post("/api/searches", json={}).status_code == 403
