"""Load an OpenAI-compatible server with concurrent streaming requests and measure it, one concurrency level at a time.

Each request streams (``stream: true``, SSE ``data:`` lines). Per request: time to first token (TTFT), the gaps
between streamed tokens (inter-token latency, ITL), end-to-end latency and output tokens (the server's ``usage``
when it sends one, else one token per non-empty chunk). Per level: output tok/s and requests/s over the level's
wall time, mean/p50/p99 of each latency, and errors; :func:`level_metrics` turns them into ``MetricRow`` s at
level ``"c=N"``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from storage.types import MetricRow

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
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def req_s(self) -> float:
        return len(self.ok_requests) / self.wall_s if self.wall_s > 0 else 0.0

    def first_error(self) -> str:
        return next((r.error for r in self.requests if not r.ok), "")


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
    """Requests sent at each level; default ``max(min_requests, rounds * concurrency)``."""
    rounds: int = 2
    min_requests: int = 8
    warmup_requests: int = 1
    request_timeout_s: float = 600.0
    ignore_eos: bool = True
    seed: int = 0
    extra_body: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> LoadConfig:
        kw = {k: settings[k] for k in ("api", "prompt_len", "output_len", "length_jitter", "dataset",
                                       "requests_per_level", "rounds", "min_requests", "warmup_requests",
                                       "request_timeout_s", "ignore_eos", "seed", "extra_body")
              if settings.get(k) is not None}
        kw["model"] = str(settings.get("served_model_name") or settings.get("model") or "default")
        cfg = cls(**kw)
        if cfg.api not in ("completions", "chat"):
            raise ValueError(f"settings `api` must be 'completions' or 'chat', but got {cfg.api!r}.")
        if not 0 <= cfg.length_jitter < 1:
            raise ValueError(f"settings `length_jitter` must be in [0, 1), but got {cfg.length_jitter!r}.")
        return cfg

    def n_requests(self, concurrency: int) -> int:
        if self.requests_per_level:
            return int(self.requests_per_level)
        return max(self.min_requests, self.rounds * concurrency)


def _jitter(n: int, j: float, rng: random.Random) -> int:
    return max(1, round(n * rng.uniform(1 - j, 1 + j))) if j else max(1, n)


def make_requests(cfg: LoadConfig, count: int, offset: int = 0) -> list[RequestSpec]:
    """``count`` requests: from the dataset (cycled) or synthetic prompts of ``prompt_len`` words."""
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
    body: dict[str, Any] = {"model": cfg.model, "max_tokens": req.max_tokens, "temperature": 0.0, "stream": True,
                            "stream_options": {"include_usage": True}}
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    body.update(cfg.extra_body)
    if cfg.api == "chat" or isinstance(req.prompt, list):
        msgs = req.prompt if isinstance(req.prompt, list) else [{"role": "user", "content": req.prompt}]
        return "/v1/chat/completions", {**body, "messages": msgs}
    return "/v1/completions", {**body, "prompt": req.prompt}


def _chunk_text(event: dict[str, Any]) -> str:
    text = ""
    for choice in event.get("choices") or []:
        text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text


async def one_request(client: httpx.AsyncClient, base_url: str, cfg: LoadConfig, req: RequestSpec) -> RequestResult:
    path, body = _body(cfg, req)
    start = time.perf_counter()
    last = None
    ttft = math.nan
    chunks = 0
    usage_tokens = None
    itl: list[float] = []
    try:
        async with client.stream("POST", base_url + path, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:300]
                return RequestResult(ok=False, error=f"HTTP {resp.status_code}: {text}")
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
                if event.get("error"):
                    return RequestResult(ok=False, error=f"stream error: {str(event['error'])[:300]}")
                if event.get("usage") and event["usage"].get("completion_tokens") is not None:
                    usage_tokens = int(event["usage"]["completion_tokens"])
                if _chunk_text(event):
                    now = time.perf_counter()
                    if last is None:
                        ttft = now - start
                    else:
                        itl.append(now - last)
                    last = now
                    chunks += 1
    except (httpx.HTTPError, OSError) as exc:
        return RequestResult(ok=False, error=f"{type(exc).__name__}: {exc}"[:300])
    end = time.perf_counter()
    if chunks == 0:
        return RequestResult(ok=False, error="the stream ended without a token")
    tokens = usage_tokens if usage_tokens is not None else chunks
    return RequestResult(ok=True, ttft_s=ttft, e2e_s=end - start, output_tokens=tokens, itl_s=itl)


async def _run_level(base_url: str, cfg: LoadConfig, concurrency: int, reqs: Sequence[RequestSpec],
                     should_abort: Callable[[], str | None] | None, deadline: float | None) -> LevelResult:
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    timeout = httpx.Timeout(cfg.request_timeout_s, connect=10.0)
    queue: asyncio.Queue[RequestSpec] = asyncio.Queue()
    for r in reqs:
        queue.put_nowait(r)
    results: list[RequestResult] = []

    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        async def worker() -> None:
            while True:
                try:
                    req = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                results.append(await one_request(client, base_url, cfg, req))

        start = time.perf_counter()
        workers = [asyncio.create_task(worker()) for _ in range(min(concurrency, len(reqs)))]
        aborted = ""
        pending = set(workers)
        while pending:
            done, pending = await asyncio.wait(pending, timeout=0.1)
            why = should_abort() if should_abort else None
            if why is None and deadline is not None and time.time() >= deadline:
                why = "deadline reached during the load"
            if why:
                aborted = why
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                break
        wall = time.perf_counter() - start
    return LevelResult(concurrency, wall, results, aborted)


def run_level(base_url: str, cfg: LoadConfig, concurrency: int, *, level_index: int = 0,
              should_abort: Callable[[], str | None] | None = None, deadline: float | None = None) -> LevelResult:
    """Send ``cfg.n_requests(concurrency)`` requests with ``concurrency`` in flight; blocking."""
    if concurrency < 1:
        raise ValueError(f"`concurrency` must be >= 1, but got {concurrency}.")
    reqs = make_requests(cfg, cfg.n_requests(concurrency), offset=1000 * (level_index + 1))
    result = asyncio.run(_run_level(base_url, cfg, concurrency, reqs, should_abort, deadline))
    _logger.info("c=%d: %d ok, %d errors, %.1f tok/s, %.2f req/s in %.2fs", concurrency, len(result.ok_requests),
                 result.errors, result.tok_s, result.req_s, result.wall_s)
    return result


def warmup(base_url: str, cfg: LoadConfig, deadline: float | None = None) -> LevelResult | None:
    if cfg.warmup_requests <= 0:
        return None
    short = LoadConfig(**{**cfg.__dict__, "output_len": min(cfg.output_len, 8), "dataset": None,
                          "requests_per_level": cfg.warmup_requests, "length_jitter": 0.0})
    reqs = make_requests(short, cfg.warmup_requests)
    return asyncio.run(_run_level(base_url, short, 1, reqs, None, deadline))


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


METRIC_UNITS = {"tok_s": "tok/s", "req_s": "req/s", "errors": "count", "error_rate": "fraction",
                "ttft_ms": "ms", "itl_ms": "ms", "e2e_ms": "ms", "tok_s_per_request": "tok/s"}


def level_summary(result: LevelResult) -> dict[str, float]:
    """Every figure of one level by metric name (``ttft_ms_p99``, ``tok_s``...)."""
    ok = result.ok_requests
    out = {"tok_s": result.tok_s, "req_s": result.req_s, "errors": float(result.errors),
           "error_rate": result.errors / len(result.requests) if result.requests else 1.0}
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


def level_metrics(result: LevelResult) -> list[MetricRow]:
    level = f"c={result.concurrency}"
    rows = []
    for name, value in level_summary(result).items():
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        base = name.rsplit("_", 1)[0] if name.endswith(("_mean", "_p50", "_p99")) else name
        rows.append(MetricRow(name, level, float(value), METRIC_UNITS.get(base, "")))
    return rows
