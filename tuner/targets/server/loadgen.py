"""Load an OpenAI-compatible server with concurrent streaming requests and measure it, one concurrency level at a time.

Each request streams (``stream: true``, SSE ``data:`` lines). Per request: time to first token (TTFT), the gaps
between streamed tokens (inter-token latency, ITL), end-to-end latency, the tokens asked (``max_tokens``) and the
output tokens the server generated, counted by the first of (:data:`COUNT_METHODS`): the server's ``usage`` (asked
for with ``stream_options.include_usage``); the server's own token information in the stream (``token_ids``,
``logprobs``, llama.cpp's ``timings.predicted_n``); one token per content chunk, when the first request showed that
shape (as many chunks as tokens asked, ``finish_reason: length``; chunks with empty text count); else the model's
tokenizer on the streamed text. The result says which. A count above ``max_tokens`` is a measurement error (the
request fails), never a figure. A request is served only when the server said it finished (a ``finish_reason`` or
``usage``): a stream ended without either, ``[DONE]`` or not, was cut and is an error; an answer with empty text that
finished is served. Per level: output tok/s and requests/s over the level's wall time, mean/p50/p99 of each latency,
the request error rate and the share of the asked tokens delivered; :func:`level_metrics` turns them into
``MetricRow`` s at level ``"c=N"``, and :func:`served_problem` says when a level served too little to count (the
trial is then ``request_error``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from storage.types import MetricRow
from tuner.figures.serving import MAX_ERROR_RATE, MIN_DELIVERED  # noqa: F401 - the levels' rules, named here too
from tuner.targets.server.loadshape import LoadShape

_logger = logging.getLogger(__name__)

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "far", "away")


@dataclass(frozen=True)
class RequestSpec:
    prompt: str | list[dict[str, str]]
    max_tokens: int


@dataclass
class RequestResult:
    ok: bool
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    error: str = ""
    status: int | None = None
    """The HTTP status of a request the server answered with an error (4xx: the request's fault)."""
    asked: int = 0
    """The tokens the request asked for (``max_tokens``)."""
    count_source: str = ""
    """How ``output_tokens`` was counted: one of :data:`COUNT_METHODS`."""
    chunks: int = 0
    """Content chunks streamed (a chunk carrying a choice's text, empty text included; a chat role-only chunk is
    none)."""
    finish_chunk: bool = False
    """The last content chunk had empty text and the ``finish_reason`` (a token on some servers, not on others)."""
    finish_reason: str = ""
    """The server's ``finish_reason`` (``length``, ``stop``...), empty when it sent none."""
    over_count: bool = False
    """The count came out above the tokens asked: a measurement error (``ok`` is false)."""

    @property
    def refused(self) -> bool:
        return self.status is not None and 400 <= self.status < 500


@dataclass
class LevelResult:
    concurrency: int
    wall_s: float
    requests: list[RequestResult]
    aborted: str = ""

    @property
    def ok_requests(self) -> list[RequestResult]:
        return [r for r in self.requests if r.ok]

    @property
    def errors(self) -> int:
        return sum(1 for r in self.requests if not r.ok)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.ok_requests)

    @property
    def error_rate(self) -> float:
        return self.errors / len(self.requests) if self.requests else 1.0

    @property
    def delivered(self) -> float:
        """The share of the asked tokens delivered, over every request sent (a failed request delivered none)."""
        asked = sum(r.asked for r in self.requests)
        return sum(r.output_tokens for r in self.ok_requests) / asked if asked else 1.0

    @property
    def count_source(self) -> str:
        """How the level's tokens were counted: one of :data:`COUNT_METHODS`, or several joined (``usage+chunks``)."""
        return count_label(self.ok_requests)

    @property
    def over_counts(self) -> int:
        """Requests whose count came out above the tokens asked (measurement errors)."""
        return sum(1 for r in self.requests if r.over_count)

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def req_s(self) -> float:
        return len(self.ok_requests) / self.wall_s if self.wall_s > 0 else 0.0

    def first_error(self) -> str:
        return next((r.error for r in self.requests if not r.ok), "")

    @property
    def all_refused(self) -> bool:
        """Every request failed and the server refused each one (HTTP 4xx): the load is at fault, not the server."""
        return bool(self.requests) and all(r.refused for r in self.requests)


@dataclass
class LoadConfig:
    """What to send. Build with :meth:`from_settings`."""

    model: str = "default"
    api: str = "completions"
    """``completions`` (``/v1/completions``) or ``chat`` (``/v1/chat/completions``)."""
    prompt_len: int = 256
    output_len: int = 128
    length_jitter: float = 0.0
    """0 = fixed lengths; 0.5 = each length uniform in [0.5x, 1.5x]."""
    dataset: str | None = None
    """A JSONL file of ``{"prompt": ...}`` or ``{"messages": [...]}`` (optional ``max_tokens``/``output_len``)."""
    requests_per_level: int | None = None
    """Requests sent at each level, exactly; default ``max(min_requests, rounds * concurrency)`` and at least
    ``level_s`` seconds of sending."""
    rounds: int = 2
    min_requests: int = 8
    level_s: float = 3.0
    """Seconds each level is measured for at least, unless ``requests_per_level`` fixes the count: a fast server
    answers the default 8 requests in a tenth of a second, too short a window for a stable figure."""
    warmup_requests: int = 1
    request_timeout_s: float = 600.0
    ignore_eos: bool | None = None
    """``True``: always send ``ignore_eos`` (a server refusing it fails the trial); ``False``: never; ``None`` (the
    default): send it when the server accepts it (:func:`probe` finds out with the first request)."""
    stream_usage: bool = True
    """Ask for the token counts in the stream (``stream_options.include_usage``); off when the server refuses it."""
    count_chunks: bool = False
    """Count one token per content chunk of a stream without usage or token information: set by :func:`probe` when
    the first request showed that shape."""
    finish_chunk_counts: bool = True
    """With ``count_chunks``: a last chunk of empty text carrying the ``finish_reason`` is a token (the first request
    showed which)."""
    tokenizer: str | None = None
    """The tokenizer that counts the streamed text when the server sends no usage (default: ``model``)."""
    count_tokens: Callable[[str], int] | None = None
    """Counts the tokens of a streamed text (the model's tokenizer); loaded by :func:`probe` when the server streams
    without usage."""
    warmup_s: float = 30.0
    """The warm-up's limit in seconds: it runs until the time to first token settles (:func:`ttft_settled`), at
    least ``warmup_requests`` requests, at most this long."""
    warmup_max_requests: int = 64
    """The warm-up's limit in requests."""
    seed: int = 0
    extra_body: dict[str, Any] = field(default_factory=dict)
    shape: LoadShape | None = None
    """The request lengths (:mod:`tuner.targets.server.loadshape`); built by :meth:`from_settings`."""

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> LoadConfig:
        kw = {
            k: settings[k]
            for k in (
                "api",
                "prompt_len",
                "output_len",
                "length_jitter",
                "dataset",
                "requests_per_level",
                "rounds",
                "min_requests",
                "level_s",
                "warmup_requests",
                "request_timeout_s",
                "ignore_eos",
                "seed",
                "extra_body",
                "tokenizer",
                "warmup_s",
                "warmup_max_requests",
            )
            if settings.get(k) is not None
        }
        kw["model"] = str(settings.get("served_model_name") or settings.get("model") or "default")
        if not kw.get("tokenizer") and settings.get("model"):
            kw["tokenizer"] = str(settings["model"])
        cfg = cls(**kw)
        if cfg.api not in ("completions", "chat"):
            raise ValueError(f"settings `api` must be 'completions' or 'chat', but got {cfg.api!r}.")
        if not 0 <= cfg.length_jitter < 1:
            raise ValueError(f"settings `length_jitter` must be in [0, 1), but got {cfg.length_jitter!r}.")
        cfg.shape = LoadShape.from_settings(settings, cfg.prompt_len, cfg.output_len, cfg.length_jitter)
        return cfg

    def n_requests(self, concurrency: int) -> int:
        if self.requests_per_level:
            return int(self.requests_per_level)
        return max(self.min_requests, self.rounds * concurrency)


def _jitter(n: int, j: float, rng: random.Random) -> int:
    return max(1, round(n * rng.uniform(1 - j, 1 + j))) if j else max(1, n)


def make_requests(cfg: LoadConfig, count: int, offset: int = 0) -> list[RequestSpec]:
    """``count`` requests: of the load's shape, else from the dataset (cycled) or synthetic prompts of
    ``prompt_len`` words."""
    if cfg.shape is not None:
        return [RequestSpec(p, m) for p, m in cfg.shape.requests(count, cfg.seed, offset)]
    rng = random.Random(cfg.seed + offset)
    if cfg.dataset:
        rows = load_dataset(cfg.dataset)
        out = []
        for i in range(count):
            row = rows[(offset + i) % len(rows)]
            prompt = row.get("messages") or row.get("prompt") or row.get("text")
            max_tokens = int(row.get("max_tokens") or row.get("output_len") or cfg.output_len)
            out.append(RequestSpec(prompt, max_tokens))
        return out
    out = []
    for _ in range(count):
        n = _jitter(cfg.prompt_len, cfg.length_jitter, rng)
        words = [rng.choice(WORDS) for _ in range(n)]
        out.append(RequestSpec(" ".join(words), _jitter(cfg.output_len, cfg.length_jitter, rng)))
    return out


def load_dataset(path: str) -> list[dict[str, Any]]:
    rows = []
    with open(Path(path).expanduser()) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not a JSON line ({exc.msg}); one JSON object per line") from None
            if isinstance(row, str):
                row = {"prompt": row}
            if not isinstance(row, dict) or not (row.get("prompt") or row.get("messages") or row.get("text")):
                raise ValueError(f"{path}:{i}: a row needs `prompt` or `messages`, got {str(row)[:80]!r}")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: the dataset is empty; give one JSON object per line")
    return rows


def _body(cfg: LoadConfig, req: RequestSpec) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": cfg.model, "max_tokens": req.max_tokens, "temperature": 0.0, "stream": True}
    if cfg.stream_usage:
        body["stream_options"] = {"include_usage": True}
    if cfg.ignore_eos is not False:
        body["ignore_eos"] = True
    body.update(cfg.extra_body)
    if cfg.api == "chat" or isinstance(req.prompt, list):
        msgs = req.prompt if isinstance(req.prompt, list) else [{"role": "user", "content": req.prompt}]
        return "/v1/chat/completions", {**body, "messages": msgs}
    return "/v1/completions", {**body, "prompt": req.prompt}


COUNT_METHODS = ("usage", "server", "chunks", "tokenizer")
"""How a request's output tokens are counted, in the order tried: the server's ``usage``; its own token information
in the stream (``token_ids``, ``logprobs``, ``timings.predicted_n``); one per content chunk (when the stream shows
that shape); the model's tokenizer on the streamed text."""


def count_label(requests: Iterable[RequestResult]) -> str:
    """The counting methods ``requests`` used, in :data:`COUNT_METHODS` order, joined by ``+`` (``none``: none)."""
    used = {r.count_source for r in requests if r.count_source}
    return "+".join(m for m in COUNT_METHODS if m in used) or "none"


def _chunk_text(event: dict[str, Any]) -> str:
    text = ""
    for choice in event.get("choices") or []:
        text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text


def _content_chunk(event: dict[str, Any]) -> str:
    """What the event carries of generated text: ``text`` (text, empty text too: a completion's ``text`` key, or a
    chat ``delta`` with ``content`` and no ``role``; the role chunk a chat stream opens with is no token), ``finish``
    (empty text with a ``finish_reason``: a token of its own on some servers, only the end on others), or ``""``."""
    kind = ""
    for choice in event.get("choices") or []:
        if "text" in choice:
            text = choice.get("text")
        else:
            delta = choice.get("delta") or {}
            if "role" in delta or "content" not in delta:
                continue
            text = delta.get("content")
        if text is None:
            continue
        if text == "" and choice.get("finish_reason"):
            kind = kind or "finish"
            continue
        return "text"
    return kind


def _server_tokens(event: dict[str, Any]) -> int | None:
    """The tokens this event says the server generated, from its own token information: ``token_ids`` (SGLang,
    vLLM), ``logprobs`` (one entry per token), llama.cpp's ``timings.predicted_n`` (a total); None when it offers
    none."""
    n = None
    for choice in event.get("choices") or []:
        ids = choice.get("token_ids")
        if ids is None:
            ids = (choice.get("delta") or {}).get("token_ids")
        lp = choice.get("logprobs")
        if isinstance(ids, list):
            n = (n or 0) + len(ids)
        elif isinstance(lp, dict) and isinstance(lp.get("tokens"), list):
            n = (n or 0) + len(lp["tokens"])
        elif isinstance(lp, dict) and isinstance(lp.get("content"), list):
            n = (n or 0) + len(lp["content"])
    return n


async def one_request(
    client: httpx.AsyncClient,
    base_url: str,
    cfg: LoadConfig,
    req: RequestSpec,
    on_first: Callable[[float], None] | None = None,
) -> RequestResult:
    """One streamed request; ``on_first(ttft_s)`` is called when its first token arrives. Served only when the server
    said it finished; counted as the module's docstring says."""
    path, body = _body(cfg, req)
    start = time.perf_counter()
    last = None
    ttft = math.nan
    chunks = 0
    usage_tokens = None
    server_tokens: int | None = None
    timing_tokens: int | None = None
    text: list[str] = []
    finish = ""
    finish_chunk = False
    itl: list[float] = []
    asked = req.max_tokens
    try:
        async with client.stream("POST", base_url + path, json=body) as resp:
            if resp.status_code != 200:
                err = (await resp.aread()).decode(errors="replace")[:300]
                return RequestResult(
                    ok=False, error=f"HTTP {resp.status_code}: {err}", status=resp.status_code, asked=asked
                )
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    event = json.loads(data)
                except json.JSONDecodeError:
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("error"):
                    return RequestResult(ok=False, error=f"stream error: {str(event['error'])[:300]}", asked=asked)
                for c in event.get("choices") or []:
                    finish = str(c.get("finish_reason") or "") or finish
                if event.get("usage") and event["usage"].get("completion_tokens") is not None:
                    usage_tokens = int(event["usage"]["completion_tokens"])
                if (n := _server_tokens(event)) is not None:
                    server_tokens = (server_tokens or 0) + n
                timings = event.get("timings")
                if isinstance(timings, dict) and isinstance(timings.get("predicted_n"), int):
                    timing_tokens = int(timings["predicted_n"])
                if piece := _chunk_text(event):
                    text.append(piece)
                if kind := _content_chunk(event):
                    finish_chunk = kind == "finish"
                    now = time.perf_counter()
                    if last is None:
                        ttft = now - start
                        if on_first is not None:
                            on_first(ttft)
                    else:
                        itl.append(now - last)
                    last = now
                    chunks += 1
    except (httpx.HTTPError, OSError) as exc:
        return RequestResult(ok=False, error=f"{type(exc).__name__}: {exc}"[:300], asked=asked, chunks=chunks)
    end = time.perf_counter()
    seen = {"chunks": chunks, "finish_reason": finish, "asked": asked, "finish_chunk": finish_chunk}
    if not finish and usage_tokens is None:
        # [DONE] or not: the server never said the request finished, so it was cut (a cancelled stream)
        return RequestResult(
            ok=False,
            error=f"the stream was cut after {chunks} chunks (the server sent no finish_reason and no usage)",
            **seen,
        )
    if usage_tokens is not None:
        tokens, source = usage_tokens, "usage"
    elif server_tokens is not None or timing_tokens is not None:
        tokens, source = (timing_tokens if timing_tokens is not None else server_tokens), "server"
    elif cfg.count_chunks:
        tokens, source = chunks - (finish_chunk and not cfg.finish_chunk_counts), "chunks"
    elif cfg.count_tokens is not None:
        tokens, source = cfg.count_tokens("".join(text)), "tokenizer"
    else:
        return RequestResult(ok=False, error=_NO_COUNT + " and no tokenizer counts its text", **seen)
    if chunks - finish_chunk == 0:
        # nothing streamed before the end (``transformers serve`` holds back bytes that are not yet valid UTF-8):
        # the first output a client could see came at the end
        ttft = end - start
    if asked and tokens > asked:
        return RequestResult(
            ok=False,
            over_count=True,
            count_source=source,
            output_tokens=tokens,
            error=f"counted {tokens} tokens ({source}) for {asked} asked (max_tokens): a measurement "
            "error, not a figure",
            **seen,
        )
    return RequestResult(
        ok=True, ttft_s=ttft, e2e_s=end - start, output_tokens=tokens, itl_s=itl, count_source=source, **seen
    )


async def wait_or_abort(
    tasks: Iterable[asyncio.Task],
    should_abort: Callable[[], str | None] | None,
    deadline: float | None,
    cut: Callable[[], bool] | None = None,
) -> str:
    """Wait for ``tasks``, looking every 0.1 s whether to stop early: ``should_abort()`` gives a reason (the server
    failed), the ``deadline`` (``time.time()``) passed, or ``cut()`` says the measurement has seen enough. On a stop
    the tasks left are cancelled (and awaited). Returns why it was aborted, ``""`` when it was not (a cut is no
    abort)."""
    pending = set(tasks)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=0.1)
        why = should_abort() if should_abort else None
        if why is None and deadline is not None and time.time() >= deadline:
            why = "deadline reached during the load"
        if why or (pending and cut is not None and cut()):
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return why or ""
    return ""


async def _run_level(
    base_url: str,
    cfg: LoadConfig,
    concurrency: int,
    reqs: Sequence[RequestSpec],
    should_abort: Callable[[], str | None] | None,
    deadline: float | None,
    min_s: float = 0.0,
) -> LevelResult:
    """Send ``reqs`` with ``concurrency`` in flight; past the end of ``reqs`` keep sending them again (in order)
    until ``min_s`` seconds have passed since the start, then let the requests in flight finish."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=10.0)
    results: list[RequestResult] = []
    sent = 0
    start = time.perf_counter()

    def next_request() -> RequestSpec | None:
        nonlocal sent
        if sent >= len(reqs) and (
            time.perf_counter() - start >= min_s or (deadline is not None and time.time() >= deadline)
        ):
            return None
        req = reqs[sent % len(reqs)]
        sent += 1
        return req

    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:

        async def worker() -> None:
            while (req := next_request()) is not None:
                results.append(await one_request(client, base_url, cfg, req))

        start = time.perf_counter()
        workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(reqs)))]
        aborted = await wait_or_abort(workers, should_abort, deadline)
        wall = time.perf_counter() - start
    return LevelResult(concurrency, wall, results, aborted)


def run_level(
    base_url: str,
    cfg: LoadConfig,
    concurrency: int,
    *,
    level_index: int = 0,
    should_abort: Callable[[], str | None] | None = None,
    deadline: float | None = None,
) -> LevelResult:
    """Send ``cfg.n_requests(concurrency)`` requests with ``concurrency`` in flight; blocking."""
    if concurrency < 1:
        raise ValueError(f"`concurrency` must be >= 1, but got {concurrency}.")
    reqs = make_requests(cfg, cfg.n_requests(concurrency), offset=1000 * (level_index + 1))
    min_s = 0.0 if cfg.requests_per_level else cfg.level_s
    result = asyncio.run(_run_level(base_url, cfg, concurrency, reqs, should_abort, deadline, min_s))
    _logger.info(
        "c=%d: %d ok, %d errors, %.1f tok/s, %.2f req/s in %.2fs, %.0f%% of the asked tokens delivered",
        concurrency,
        len(result.ok_requests),
        result.errors,
        result.tok_s,
        result.req_s,
        result.wall_s,
        100 * result.delivered,
    )
    return result


@dataclass
class Probe:
    """What the first requests after start-up learnt: the load the server accepts (``config``), what was changed
    to get there (``adapted``), what the server does not honour (``ignored``: ``ignore_eos`` or ``max_tokens``), or
    why the load cannot run at all (``refused``); and the warm-up's length."""

    config: LoadConfig
    adapted: list[str] = field(default_factory=list)
    refused: str = ""
    warmup_s: float = 0.0
    first: RequestResult | None = None
    ignored: str = ""
    """One line when the server delivered another count of tokens than asked with ``ignore_eos`` sent."""
    warmup_requests: int = 0
    warmup_ttft_ms: list[float] = field(default_factory=list)
    broke_off: bool = False
    """A request of the probe or the warm-up failed (no answer, a reset connection): a dying server's first sign,
    often seen before its process has exited."""

    @property
    def honours_length(self) -> bool:
        return not self.ignored


_CORE_FIELDS = ("model", "prompt", "messages", "max_tokens", "stream")
_NO_COUNT = "the server streamed no token counts (usage)"


def _named_field(error: str, body: dict[str, Any]) -> str | None:
    """The request field an error text names (``Unexpected fields in the request: {'ignore_eos'}``, pydantic's
    ``loc: [body, ignore_eos]``, ``Unrecognized request argument supplied: ignore_eos``)."""
    for name in sorted(body, key=lambda k: (k in _CORE_FIELDS, -len(k))):
        if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", error):
            return name
    return None


def load_tokenizer(name: str) -> Callable[[str], int]:
    """A counter of the tokens of a text with the model's own tokenizer (``transformers``' ``AutoTokenizer``, from a
    path, a GGUF file's own vocabulary (needs ``gguf``; read on the CPU), or the local hub cache)."""
    from transformers import AutoTokenizer

    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":  # a GGUF-only model: the vocabulary it carries
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
        return lambda text: len(tok.encode(text, add_special_tokens=False))
    # local files only (a hub name from the cache the server read too): a trial never waits on the network
    tok = AutoTokenizer.from_pretrained(str(path) if path.exists() else name, local_files_only=True)
    return lambda text: len(tok.encode(text, add_special_tokens=False))


def probe(base_url: str, cfg: LoadConfig, deadline: float | None = None) -> Probe:
    """Send the first request and learn which request fields the server accepts. A field the load adds on its own
    (``ignore_eos`` unless set true, ``stream_options``) that the server refuses with HTTP 4xx is dropped and the
    request sent again: without ``ignore_eos`` every request keeps its fixed ``max_tokens``. A server that streams
    no usage and no token information gets one token counted per content chunk when the first answer shows that
    shape (as many chunks as tokens asked, ``finish_reason: length``), else its text counted by the model's tokenizer
    (setting ``tokenizer``, default the model); without one the load is refused. Any other refusal is ``refused``,
    naming the field and the setting that fixes it. The first answer tells whether the server honours ``max_tokens``
    with ``ignore_eos`` (``ignored`` when not). Then the warm-up runs until the time to first token settles
    (:func:`ttft_settled`). Blocking."""
    t0 = time.time()
    short = replace(cfg, output_len=min(cfg.output_len, 8), dataset=None, length_jitter=0.0, shape=None)
    out = Probe(config=cfg)
    for _ in range(4):
        req = make_requests(short, 1)[0]
        _, body = _body(short, req)
        res = asyncio.run(_run_level(base_url, short, 1, [req], None, deadline))
        first = res.requests[0] if res.requests else RequestResult(ok=False, error="no request was sent")
        out.first = first
        if not first.ok and first.error.startswith(_NO_COUNT) and not cfg.count_chunks and cfg.count_tokens is None:
            if (
                first.finish_reason == "length"
                and first.asked
                and first.asked in (first.chunks, first.chunks - first.finish_chunk)
            ):
                # the stream shows its shape: one chunk per token (empty text included), as many as asked; a last
                # empty chunk carrying the finish_reason is a token only when the count needs it
                shape = {"count_chunks": True, "finish_chunk_counts": first.chunks == first.asked}
                cfg, short = replace(cfg, **shape), replace(short, **shape)
                out.adapted.append(
                    f"no usage in the stream: one token counted per content chunk (the first "
                    f"request streamed {first.chunks} chunks for the {first.asked} tokens asked, "
                    "finish_reason length)"
                )
                _logger.warning("the server at %s: %s", base_url, out.adapted[-1])
                continue
            try:
                counter = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
            except ImportError as exc:  # transformers, or gguf for a GGUF file's vocabulary
                missing = getattr(exc, "name", None) or ("gguf" if "gguf" in str(exc).lower() else "transformers")
                counter, why = None, f"{missing} is not installed: pip install 'tuner[tokenizer]'"
            except Exception as exc:  # noqa: BLE001 - any failure to load names the setting that fixes it
                counter, why = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            else:
                why = "setting `tokenizer` is not set"
            if counter is None:
                shape = (
                    f"its chunks are not one per token ({first.chunks} chunks for {first.asked} tokens asked, "
                    f"finish_reason {first.finish_reason or 'none'})"
                )
                out.refused = (
                    f"the server streams no token counts (usage, token ids) and {shape}, and the model's "
                    f"tokenizer {cfg.tokenizer!r} cannot count its text ({why}); set `tokenizer` to the "
                    "model's tokenizer (a path or hub name)"
                )
                break
            cfg, short = replace(cfg, count_tokens=counter), replace(short, count_tokens=counter)
            out.adapted.append(f"no usage in the stream: tokens counted by the tokenizer {cfg.tokenizer!r}")
            _logger.warning("the server at %s: %s", base_url, out.adapted[-1])
            continue
        if first.ok or not first.refused:
            break
        name = _named_field(first.error, body)
        if name == "ignore_eos" and cfg.ignore_eos is None:
            cfg, short = replace(cfg, ignore_eos=False), replace(short, ignore_eos=False)
            out.adapted.append(
                "ignore_eos dropped (the server refuses it): fixed max_tokens, output length from the token counts"
            )
        elif name == "stream_options" and cfg.stream_usage:
            cfg, short = replace(cfg, stream_usage=False), replace(short, stream_usage=False)
            out.adapted.append("stream_options dropped (the server refuses it): no usage asked for")
        else:
            out.refused = _refusal(name, first.error, cfg)
            break
        _logger.warning("the server at %s refuses request field `%s`: %s", base_url, name, out.adapted[-1])
    out.config = cfg
    first = out.first
    if first is not None and first.ok and first.output_tokens != first.asked:
        what = (
            ("ignore_eos" if cfg.ignore_eos is not False else "max_tokens")
            if first.output_tokens < first.asked
            else "max_tokens"
        )
        out.ignored = (
            f"the server does not honour {what}: asked {first.asked} tokens, got {first.output_tokens} "
            f"({first.count_source} count); throughput counts the tokens delivered, and a level "
            "delivering too few is request_error"
        )
        _logger.warning("%s", out.ignored)
    if first is not None and first.ok:
        _warm_until_settled(base_url, short, first, out, deadline)
    elif not out.refused:
        out.broke_off = True
    out.warmup_s = time.time() - t0
    return out


WARMUP_WINDOW = 3
"""Requests per window of :func:`ttft_settled`."""


def ttft_settled(ttft_ms: Sequence[float], window: int = WARMUP_WINDOW) -> bool:
    """The time to first token has settled: the median of the newest ``window`` requests is no longer falling
    (at least 0.7x the median of the ``window`` before them). Slow first requests (compiling, caches filling) fall
    window after window; noise around a settled value does not."""
    if len(ttft_ms) < 2 * window:
        return False
    new, old = sorted(ttft_ms[-window:]), sorted(ttft_ms[-2 * window : -window])
    return new[window // 2] >= 0.7 * old[window // 2]


def _warm_until_settled(
    base_url: str, short: LoadConfig, first: RequestResult, out: Probe, deadline: float | None
) -> None:
    """One request at a time after the first, until at least ``warmup_requests`` were sent and the time to first
    token settled, or the warm-up's time (``warmup_s``) or request limit (``warmup_max_requests``) is spent."""
    cfg = out.config
    ttfts = [first.ttft_s * 1e3]
    t0 = time.time()
    n = 1
    while n < cfg.warmup_max_requests and time.time() - t0 < cfg.warmup_s:
        if n >= max(1, cfg.warmup_requests) and ttft_settled(ttfts):
            break
        if deadline is not None and time.time() >= deadline:
            break
        req = make_requests(short, 1, offset=n)[0]
        res = asyncio.run(_run_level(base_url, short, 1, [req], None, deadline))
        n += 1
        if not (res.requests and res.requests[0].ok):
            out.broke_off = True  # a failing server: the caller looks at the process, the levels say why
            break
        ttfts.append(res.requests[0].ttft_s * 1e3)
    out.warmup_requests = n
    out.warmup_ttft_ms = ttfts


def _refusal(name: str | None, error: str, cfg: LoadConfig) -> str:
    if name == "ignore_eos":
        fix = "set `ignore_eos: false` (or leave it unset: the load then goes without it)"
    elif name in cfg.extra_body:
        fix = f"remove `{name}` from setting `extra_body`"
    elif name == "model":
        fix = "set `served_model_name` (or `model`) to a name the server lists at /v1/models"
    elif name in ("prompt", "messages"):
        fix = "set `api: chat` or `api: completions` to the API the server has"
    elif name:
        fix = f"the load cannot run without `{name}`; use a server that accepts it"
    else:
        fix = "check settings `model`/`served_model_name` and `api`"
    field_text = f"request field `{name}`" if name else "the load's request"
    return f"the server refuses {field_text} ({error[:200]}); {fix}"


def warmup(base_url: str, cfg: LoadConfig, deadline: float | None = None) -> Probe:
    """The first requests after start-up: :func:`probe`."""
    return probe(base_url, cfg, deadline)


def _pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile, linearly interpolated; a request cut short (``inf``) counts as later than every other."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    if s[lo] == s[hi]:  # also inf == inf, where the interpolation would give nan
        return s[lo]
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


METRIC_UNITS = {
    "tok_s": "tok/s",
    "req_s": "req/s",
    "errors": "count",
    "error_rate": "fraction",
    "delivered": "fraction",
    "ttft_ms": "ms",
    "itl_ms": "ms",
    "e2e_ms": "ms",
    "tok_s_per_request": "tok/s",
}


def level_summary(result: LevelResult) -> dict[str, float]:
    """Every figure of one level by metric name (``ttft_ms_p99``, ``tok_s``...)."""
    ok = result.ok_requests
    out = {
        "tok_s": result.tok_s,
        "req_s": result.req_s,
        "errors": float(result.errors),
        "error_rate": result.error_rate,
        "delivered": result.delivered,
    }
    series = {
        "ttft_ms": [r.ttft_s * 1e3 for r in ok],
        "itl_ms": [g * 1e3 for r in ok for g in r.itl_s],
        "e2e_ms": [r.e2e_s * 1e3 for r in ok],
    }
    for name, vals in series.items():
        out[f"{name}_mean"] = _mean(vals)
        out[f"{name}_p50"] = _pct(vals, 0.5)
        out[f"{name}_p99"] = _pct(vals, 0.99)
        out[name] = out[f"{name}_mean"]
    rates = [(r.output_tokens - 1) / (r.e2e_s - r.ttft_s) for r in ok if r.output_tokens > 1 and r.e2e_s > r.ttft_s]
    out["tok_s_per_request"] = _mean(rates)
    return out


SHORT_WINDOW_S = 1.0
"""A level measured over less than this is flagged (metric ``short_window``): its figure is noise-prone."""


def level_metrics(result: LevelResult) -> list[MetricRow]:
    """Every figure of one level as rows at level ``c=N``, with the window it was measured over (``measure_s``,
    ``requests``) and ``short_window`` = 1 when that window was under :data:`SHORT_WINDOW_S`."""
    level = f"c={result.concurrency}"
    rows = [
        MetricRow("measure_s", level, float(result.wall_s), "s"),
        MetricRow("requests", level, float(len(result.requests)), "count"),
    ]
    if result.wall_s < SHORT_WINDOW_S:
        _logger.warning(
            "c=%d measured over %.2fs only (%d requests): set `level_s` (seconds per level) or "
            "`requests_per_level` higher for a stable figure",
            result.concurrency,
            result.wall_s,
            len(result.requests),
        )
        rows.append(MetricRow("short_window", level, 1.0, "flag"))
    rows.append(MetricRow(f"count:{result.count_source}", level, 1.0, "flag"))  # how the tokens were counted
    if result.over_counts:  # counts above max_tokens: measurement errors (failed requests), flagged
        rows.append(MetricRow("count_over_asked", level, float(result.over_counts), "count"))
    for name, value in level_summary(result).items():
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        base = name.rsplit("_", 1)[0] if name.endswith(("_mean", "_p50", "_p99")) else name
        rows.append(MetricRow(name, level, float(value), METRIC_UNITS.get(base, "")))
    return rows


def served_problem(
    result: LevelResult, max_error_rate: float = MAX_ERROR_RATE, min_delivered: float = MIN_DELIVERED
) -> str:
    """Why a level does not count (it served too little of what was asked), or ``""``: a request error rate above
    ``max_error_rate`` or a share of the asked tokens delivered below ``min_delivered``."""
    why = []
    if result.error_rate > max_error_rate:
        why.append(
            f"{100 * result.error_rate:.1f}% of {len(result.requests)} requests failed (limit "
            f"{100 * max_error_rate:g}%: setting `max_error_rate`; first: {result.first_error()[:160]})"
        )
    if result.delivered < min_delivered:
        why.append(
            f"{100 * result.delivered:.1f}% of the asked tokens delivered (at least {100 * min_delivered:g}%: "
            "setting `min_delivered`)"
        )
    return "; ".join(why)
