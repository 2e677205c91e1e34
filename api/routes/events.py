"""Live events of a study as Server-Sent Events, read from the ``tuner_events`` table by id cursor.

The stream first replays every event after the cursor (``Last-Event-ID`` header or ``?after=``), then polls the
table every ``sse_poll_s`` in the threadpool. It ends once the run has ended and every event is sent (a resumed
study's earlier ``search_ended`` events do not end it), after ``sse_max_s``, or when the client goes.

The endpoint returns its :class:`EventStream` itself (a plain ``StreamingResponse`` of SSE-formatted bytes, with
a ``: ping`` comment after :data:`KEEPALIVE_S` without an event) rather than yielding events for FastAPI's SSE
encoder: in FastAPI 0.165 that encoder's keep-alive task raises ``BrokenResourceError`` whenever a client closes the
stream while it is sending (fastapi discussion #15725), and uvicorn logged it as "Exception in ASGI application" on
every normal disconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from fastapi.sse import format_sse_event

from api.deps import RunDep, StateDep
from api.schemas import NOT_FOUND, UNAVAILABLE, EventOut
from api.state import ApiState
from storage import Event

router = APIRouter(prefix="/api/studies", tags=["events"], responses=UNAVAILABLE)
_logger = logging.getLogger(__name__)

EVENT_KINDS = (
    "trial_started",
    "trial_finished",
    "trial_pruned",
    "trial_failed",
    "new_best",
    "stage_started",
    "search_ended",
)


class EventStream(StreamingResponse):
    """``text/event-stream`` bytes the endpoint formats itself (not FastAPI's ``EventSourceResponse``, which makes
    FastAPI encode a generator's events: see the module docstring)."""

    media_type = "text/event-stream"


KEEPALIVE_S = 15.0
"""Seconds without an event after which the stream sends a ``: ping`` comment (proxies close idle streams)."""
_STREAM_ITEM = {
    "type": "object",
    "properties": {
        "data": {"type": "string"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer", "minimum": 0},
    },
}
KEEPALIVE = format_sse_event(comment="ping")
_RECHECK_EVERY = 20
"""Polls between re-reads of the run's state (a search killed hard never writes ``search_ended``)."""


def _sse(ev: Event) -> bytes:
    data = EventOut(
        id=ev.id, kind=ev.kind, trial_number=ev.trial_number, payload=ev.payload or {}, created_at=ev.created_at
    )
    return format_sse_event(data_str=data.model_dump_json(), event=ev.kind, id=str(ev.id))


@router.get(
    "/{name}/events",
    responses={**NOT_FOUND, 200: {"content": {"text/event-stream": {"itemSchema": _STREAM_ITEM}}}},
    response_class=EventStream,
    description="Event kinds (the SSE `event:` field): " + ", ".join(EVENT_KINDS) + ". `data:` is an EventOut.",
)
async def stream_events(
    run: RunDep,
    state: StateDep,
    request: Request,
    # plain integers with a default, not `int | None`: a header cannot carry null, so the schema offers none
    after: Annotated[int, Query(ge=0, le=2**62, description="replay events with a larger id")] = 0,
    last_event_id: Annotated[
        int,
        Header(alias="Last-Event-ID", ge=0, le=2**62, description="the browser's EventSource sends it on reconnect"),
    ] = 0,
) -> EventStream:
    cursor = max(after, last_event_id)

    async def body() -> AsyncIterator[bytes]:
        yield format_sse_event(comment=f"study {run.study_name}", retry=2000)
        async for chunk in _follow(state, request, run.study_name, run.id, cursor, run.state == "running"):
            yield chunk
            # a checkpoint per event: a replay is hundreds of writes with no await between them, and a client that
            # went meanwhile is only noticed by the event loop (each write after that logged "socket.send() raised
            # exception.")
            await asyncio.sleep(0)

    return EventStream(body(), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _follow(
    state: ApiState, request: Request, name: str, run_id: int, cursor: int, running: bool
) -> AsyncIterator[bytes]:
    """Replay events after ``cursor``, then poll for new ones until the search ends or the client goes.

    A ``search_ended`` ends the stream only when it is the newest event and the run is still ended when read
    after it: a resumed study has one per earlier segment, and its replay goes on past them to the live events.
    """
    repo, settings = state.repo(), state.settings
    deadline = time.monotonic() + settings.sse_max_s
    polls = 0
    last_sent = time.monotonic()
    while True:
        batch = await run_in_threadpool(repo.events_after, run_id, cursor)
        for ev in batch:
            cursor = ev.id
            yield _sse(ev)
        if batch:
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent >= KEEPALIVE_S:
            yield KEEPALIVE
            last_sent = time.monotonic()
        if len(batch) == 500:
            continue  # more to replay at once
        if batch and batch[-1].kind == "search_ended" or not running:
            fresh = await run_in_threadpool(repo.get_run, name)
            if fresh is None or fresh.state != "running":
                if not await run_in_threadpool(repo.events_after, run_id, cursor, 1):
                    return
                continue  # events written between the two reads: send them first
            running = True  # resumed since (or between) the events replayed
        if time.monotonic() > deadline or await request.is_disconnected():
            return
        polls += 1
        if polls % _RECHECK_EVERY == 0:
            fresh = await run_in_threadpool(repo.get_run, name)
            if fresh is None or fresh.state != "running":
                running = False
                continue  # one more read picks up anything written before the state changed
        await asyncio.sleep(settings.sse_poll_s)
