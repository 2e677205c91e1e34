"""GET /api/studies/{name}/events: Server-Sent Events from the tuner_events table, replay and live."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator

import httpx
import pytest
from api_search_data import MIXED, STUDY, fake_search, real_search
from conftest import run_in_thread
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings
from storage import Repo

KINDS = {"trial_started", "trial_finished", "trial_pruned", "trial_failed", "new_best", "stage_started", "search_ended"}


def parse_sse(lines) -> list[dict]:
    """Events of an SSE stream as dicts with `event`, `id` and decoded `data`."""
    events, cur = [], {}
    for line in lines:
        if line == "":
            if "data" in cur:
                events.append(cur)
            cur = {}
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            cur[field] = json.loads(value) if field == "data" else value
    return events


@pytest.mark.timeout(30)
def test_replay_of_a_finished_study_ends_after_search_ended(client: TestClient) -> None:
    with client.stream("GET", f"/api/studies/{STUDY}/events") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(r.iter_lines())
    kinds = [e["event"] for e in events]
    assert set(kinds) <= KINDS and {"trial_started", "trial_finished", "new_best"} <= set(kinds)
    assert kinds.count("trial_started") == 5
    assert kinds[-1] == "search_ended" and kinds.count("search_ended") == 1
    with client.stream("GET", f"/api/studies/{MIXED}/events") as r:
        assert {"trial_failed", "trial_pruned"} <= {e["event"] for e in parse_sse(r.iter_lines())}
    ids = [int(e["id"]) for e in events]
    assert ids == sorted(ids) and all(e["data"]["id"] == int(e["id"]) for e in events)


@pytest.mark.timeout(30)
def test_resume_with_last_event_id_and_after(client: TestClient) -> None:
    with client.stream("GET", f"/api/studies/{STUDY}/events") as r:
        all_ids = [int(e["id"]) for e in parse_sse(r.iter_lines())]
    cut = all_ids[len(all_ids) // 2]
    with client.stream("GET", f"/api/studies/{STUDY}/events", headers={"Last-Event-ID": str(cut)}) as r:
        assert [int(e["id"]) for e in parse_sse(r.iter_lines())] == [i for i in all_ids if i > cut]
    with client.stream("GET", f"/api/studies/{STUDY}/events", params={"after": cut}) as r:
        assert [int(e["id"]) for e in parse_sse(r.iter_lines())] == [i for i in all_ids if i > cut]
    assert client.get(f"/api/studies/{STUDY}/events", params={"after": -1}).status_code == 422
    assert client.get(f"/api/studies/{STUDY}/events", headers={"Last-Event-ID": "x"}).status_code == 422
    spec = client.get("/openapi.json").json()["paths"]["/api/studies/{name}/events"]["get"]
    for p in spec["parameters"]:  # what the schema allows is accepted: no `null` where a number is expected
        if p["name"] in ("after", "Last-Event-ID"):
            assert p["schema"]["type"] == "integer" and "anyOf" not in p["schema"], p


@pytest.mark.timeout(60)
def test_replay_of_a_resumed_study_goes_past_its_first_search_ended(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'resumed.db'}"
    fake_search(url, "twice", n_trials=4)
    fake_search(url, "twice", n_trials=3, resume=True, seed=1)
    stored = [e.kind for e in Repo(url).events_after(Repo(url).get_run("twice").id, limit=10_000)]
    with TestClient(create_app(ApiSettings(storage_url=url))) as c, c.stream("GET", "/api/studies/twice/events") as r:
        kinds = [e["event"] for e in parse_sse(r.iter_lines())]
    assert kinds == stored and kinds.count("search_ended") == 2 and kinds.count("trial_started") == 7
    assert kinds[-1] == "search_ended"


@pytest.mark.timeout(60)
def test_live_stream_of_a_resumed_running_study_replays_then_follows_to_its_end(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'resumed-live.db'}"
    fake_search(url, "again", n_trials=4)
    repo = Repo(url)
    run_id = repo.get_run("again").id
    first = len(repo.events_after(run_id, limit=10_000))
    worker = run_in_thread(lambda: fake_search(url, "again", n_trials=5, delay_s=0.15, resume=True, seed=1))
    deadline = time.monotonic() + 20
    while repo.get_run("again").state != "running":
        assert time.monotonic() < deadline, "the resume never started"
        time.sleep(0.02)
    settings = ApiSettings(storage_url=url, sse_poll_s=0.05)
    with TestClient(create_app(settings)) as c, c.stream("GET", "/api/studies/again/events") as r:
        events = parse_sse(r.iter_lines())  # no cursor: the first search's events, then the live ones
    worker.join(timeout=20)
    kinds = [e["event"] for e in events]
    assert len(events) > first and kinds.count("trial_started") == 9, kinds
    assert kinds.count("search_ended") == 2 and kinds[-1] == "search_ended"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_live_stream_follows_a_real_search_to_its_end(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'real.db'}"
    worker = run_in_thread(lambda: real_search(url, "real-live", str(tmp_path / "out"), n_trials=2))
    repo = None
    deadline = time.monotonic() + 60
    while True:  # the search creates the schema and its run first
        assert time.monotonic() < deadline, "the search never created its run"
        try:
            repo = repo or Repo(url)
            if repo.has_schema() and repo.get_run("real-live") is not None:
                break
        except Exception:  # noqa: BLE001 - the database file may not exist yet
            pass
        time.sleep(0.1)
    settings = ApiSettings(storage_url=url, sse_poll_s=0.1)
    with TestClient(create_app(settings)) as c, c.stream("GET", "/api/studies/real-live/events") as r:
        events = parse_sse(r.iter_lines())
    worker.join(timeout=60)
    kinds = [e["event"] for e in events]
    assert kinds.count("trial_started") >= 2 and "new_best" in kinds and kinds[-1] == "search_ended"
    assert events[-1]["data"]["payload"]["state"] == "finished"


@pytest.mark.timeout(60)
def test_live_stream_follows_a_running_search_to_its_end(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    Repo(url).create_schema()
    worker = run_in_thread(lambda: fake_search(url, "live", n_trials=8, delay_s=0.15))
    repo = Repo(url)
    deadline = time.monotonic() + 20
    while repo.get_run("live") is None:
        assert time.monotonic() < deadline, "the search never created its run"
        time.sleep(0.02)
    settings = ApiSettings(storage_url=url, sse_poll_s=0.05)
    with TestClient(create_app(settings)) as c, c.stream("GET", "/api/studies/live/events") as r:
        events = parse_sse(r.iter_lines())
    worker.join(timeout=20)
    kinds = [e["event"] for e in events]
    assert kinds.count("trial_started") == 8 and kinds[-1] == "search_ended"
    assert kinds.count("trial_finished") + kinds.count("trial_failed") + kinds.count("trial_pruned") == 8


@pytest.mark.timeout(60)
def test_stream_of_a_search_killed_hard_ends_at_max_time_and_on_disconnect(tmp_path, live_server) -> None:
    url = f"sqlite:///{tmp_path / 'stale.db'}"
    fake_search(url, "stale", n_trials=2, end=False)  # state stays "running": no search_ended ever comes
    server = live_server(ApiSettings(storage_url=url, sse_poll_s=0.05, sse_max_s=1.5))
    t0 = time.monotonic()
    with httpx.stream("GET", f"{server.url}/api/studies/stale/events", timeout=10) as r:
        events = parse_sse(r.iter_lines())
    assert 1.0 < time.monotonic() - t0 < 8 and [e["event"] for e in events][:1] == ["trial_started"]
    server = live_server(ApiSettings(storage_url=url, sse_poll_s=0.05, sse_max_s=600))
    repo = server.app.state.api.repo()
    reads = []
    real = repo.events_after
    repo.events_after = lambda *a, **k: reads.append(time.monotonic()) or real(*a, **k)
    with httpx.stream("GET", f"{server.url}/api/studies/stale/events", timeout=10) as r:
        next(r.iter_lines())
        time.sleep(0.3)
        assert reads, "the stream never polled"
    time.sleep(1.0)  # the client went: the server stops polling for it (long before sse_max_s)
    n = len(reads)
    time.sleep(1.0)
    assert len(reads) == n, "the server kept polling for a client that went away"


@pytest.mark.timeout(60)
def test_a_client_closing_the_stream_logs_no_error_on_the_server(tmp_path, live_server) -> None:
    """FastAPI's own SSE encoder (0.165) raised BrokenResourceError from its keep-alive task when a client closed a
    live stream, and uvicorn logged "Exception in ASGI application" for every normal disconnect."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    fake_search(url, "live", n_trials=2, end=False)  # a running study: the stream stays open until the client goes
    server = live_server(ApiSettings(storage_url=url, sse_poll_s=0.05, sse_max_s=600))
    with _logged("uvicorn.error", logging.ERROR) as errors:
        for _ in range(5):
            with httpx.stream("GET", f"{server.url}/api/studies/live/events", timeout=10) as r:
                lines = r.iter_lines()
                assert next(lines).startswith(":")  # the study's comment line
                assert any(line.startswith("event: trial_started") for line in lines)
            time.sleep(0.3)  # the server notices the client went
        got = httpx.get(f"{server.url}/api/studies/live", timeout=10)
        assert got.status_code == 200  # the server still answers
    assert not errors, [r.getMessage() + str(r.exc_info and r.exc_info[1]) for r in errors]


@pytest.mark.timeout(60)
def test_a_quiet_live_stream_sends_a_ping_comment(tmp_path, live_server, monkeypatch) -> None:
    import api.routes.events as events

    monkeypatch.setattr(events, "KEEPALIVE_S", 0.3)
    url = f"sqlite:///{tmp_path / 'quiet.db'}"
    fake_search(url, "quiet", n_trials=1, end=False)
    server = live_server(ApiSettings(storage_url=url, sse_poll_s=0.05, sse_max_s=600))
    t0 = time.monotonic()
    with httpx.stream("GET", f"{server.url}/api/studies/quiet/events", timeout=10) as r:
        for line in r.iter_lines():
            if line == ": ping":
                break
            assert time.monotonic() - t0 < 10, "no ping within 10 s of a quiet stream"
    assert time.monotonic() - t0 >= 0.3


@pytest.mark.timeout(120)
def test_a_client_closing_the_stream_mid_replay_is_noticed_before_the_next_write(tmp_path, live_server) -> None:
    """A replay is hundreds of writes; without a checkpoint between them the server went on writing to the closed
    socket and asyncio logged "socket.send() raised exception." for each write (thousands a minute under a poller)."""
    url = f"sqlite:///{tmp_path / 'big.db'}"
    fake_search(url, "big", n_trials=120, end=False)  # hundreds of events to replay
    server = live_server(ApiSettings(storage_url=url, sse_poll_s=0.05, sse_max_s=600))
    with _logged("asyncio", logging.WARNING) as warned:
        for _ in range(3):
            with httpx.stream("GET", f"{server.url}/api/studies/big/events", timeout=10) as r:
                assert any(line.startswith("id:") for line in r.iter_lines())  # the first event, then the client goes
            time.sleep(0.5)
    assert [r.getMessage() for r in warned] == []


@contextlib.contextmanager
def _logged(logger: str, level: int) -> Iterator[list[logging.LogRecord]]:
    """The records ``logger`` emits at ``level`` or above meanwhile (uvicorn's and asyncio's loggers do not propagate
    to pytest's capture)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(level=level)
    logging.getLogger(logger).addHandler(handler)
    try:
        yield records
    finally:
        logging.getLogger(logger).removeHandler(handler)
