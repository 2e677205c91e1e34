"""Fixtures of the API tests: a real SQLite database filled by a small search, and TestClients on it."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from api_search_data import MIXED, STUDY, fake_search, real_search
from built_once import built_once, copy_database
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings


@pytest.fixture(scope="session")
def db_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One database with a real 6-trial search (``s1``) and the stand-in search (``mixed``). Under pytest-xdist the
    searches run once, in the first worker that asks (the others wait on a lock), and each worker gets its own copy
    of the finished database, so no worker's writes reach another's tests."""

    def build(built: Path) -> None:
        url = f"sqlite:///{built / 'tuner.db'}"
        real_search(url, STUDY, str(built / "out"))
        fake_search(url, MIXED)

    built = built_once(tmp_path_factory, "api-db", build)
    folder = tmp_path_factory.mktemp("api-db")
    shutil.copytree(built / "out", folder / "out")
    copy_database(built / "tuner.db", folder / "tuner.db")
    return f"sqlite:///{folder / 'tuner.db'}"


@pytest.fixture(scope="session")
def client(db_url: str) -> TestClient:
    with TestClient(create_app(ApiSettings(storage_url=db_url))) as c:
        yield c


@pytest.fixture
def make_client(db_url: str, tmp_path: Path) -> Callable[..., TestClient]:
    """A TestClient on the filled database with settings overridden (token, search command)."""
    made: list[TestClient] = []

    def make(**overrides) -> TestClient:
        overrides.setdefault("storage_url", db_url)
        overrides.setdefault("search_out_dir", tmp_path / "out")
        c = TestClient(create_app(ApiSettings(**overrides)))
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def run_in_thread(fn: Callable[[], object]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


class LiveServer:
    """A real uvicorn server on a free loopback port, in a thread of the test process."""

    def __init__(self, settings: ApiSettings) -> None:
        import socket

        import uvicorn

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.app = create_app(settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = run_in_thread(self.server.run)
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"uvicorn did not start on port {self.port}")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live_server() -> Callable[[ApiSettings], LiveServer]:
    servers: list[LiveServer] = []

    def start(settings: ApiSettings) -> LiveServer:
        servers.append(LiveServer(settings))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()
