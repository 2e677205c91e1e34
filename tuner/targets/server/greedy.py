"""The greedy check of a server target: fixed prompts completed at temperature 0, compared with the baseline's.

A configuration that changes numbers (a narrower dtype, a quantized KV cache, another attention kernel) can serve
faster and answer differently. With setting ``greedy_check`` each trial sends its fixed prompts once, after the
warm-up and before the load levels (so a configuration that answers wrongly is stopped before its levels are paid
for, and a trial pruned after its first level was still checked), one request at a time, greedy (``temperature:
0``) with ``max_tokens`` = ``tokens``, through the endpoint the load uses (``/v1/completions`` or
``/v1/chat/completions``, setting ``api``), not streamed. It asks for the completion's token ids
(``return_token_ids``, SGLang's field); a server that refuses the field (HTTP 4xx naming it) is asked again without
it, and the completions are compared as text.

**Agreement** of one prompt: the length of the common prefix of the trial's completion and the reference's, over
the longer of the two (token ids when both have them, else characters of text; 1.0 when both are empty). A greedy
decode that diverges once goes its own way after, so the common prefix is what the two configurations agree on.
The trial's agreement is the mean over the prompts; below ``min_agreement`` the trial is ``wrong_result`` (it never
wins and is never exported), and ``min_agreement - agreement`` is an Optuna constraint (feasible when <= 0) beside
the objective's SLO constraints.

**The reference** is the baseline trial's completions, kept in the study's storage (artifact
``greedy_reference-<key>.json``, keyed by the prompts, ``tokens``, ``api`` and the model), so a resumed study and
every parallel worker compare with the same ones. The baseline's own agreement is 1.0 by definition. A trial that
finds no reference stored (the check turned on in a resumed study whose baseline ran without it) stores its own
completions as the reference, and says so (metric ``greedy_reference`` = 1, and in its log); the first stored
stays.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import Field, field_validator

from storage.types import MetricRow
from tuner.settings import Settings

_logger = logging.getLogger(__name__)

PROMPTS = (
    "The capital of France is",
    "Write a short poem about the sea.",
    "List the first ten prime numbers:",
    "Explain in one paragraph why the sky is blue.",
    "def fibonacci(n):",
    "Translate to German: The weather is nice today.",
    "Once upon a time, in a small village by the mountains,",
    "Q: What is 17 multiplied by 23?\nA:",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "The three laws of thermodynamics are",
    "SELECT name, COUNT(*) FROM orders GROUP BY",
    "A recipe for pancakes needs the following ingredients:",
    "In 1969, the first humans to walk on the Moon were",
    "Give three tips for writing clear error messages.",
    "The difference between a list and a tuple in Python is",
    "Dear hiring manager, I am writing to apply for",
)
"""The built-in fixed prompts (``prompts: N`` takes the first N)."""
ARTIFACT_KIND = "greedy_reference"
REQUEST_FIELD = "return_token_ids"


class GreedyCheck(Settings):
    """Setting ``greedy_check``: ``{prompts: 8, tokens: 32, min_agreement: 0.9}``."""

    prompts: int | list[str] = 8
    """How many of the built-in fixed prompts (up to 16), or the prompts themselves."""
    tokens: int = Field(32, ge=1, le=4096)
    """``max_tokens`` of each greedy completion: the first N tokens compared."""
    min_agreement: float = Field(0.9, ge=0.0, le=1.0)
    """The agreement a trial needs (mean common prefix share); below it the trial is ``wrong_result``."""

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, v: int | list[str]) -> int | list[str]:
        if isinstance(v, int) and not 1 <= v <= len(PROMPTS):
            raise ValueError(f"a count of built-in prompts must be 1-{len(PROMPTS)}, but got {v}; or give a list")
        if isinstance(v, list) and (not v or not all(p.strip() for p in v)):
            raise ValueError("the prompts must be a non-empty list of non-empty strings")
        return v

    def prompt_list(self) -> list[str]:
        return list(PROMPTS[: self.prompts]) if isinstance(self.prompts, int) else list(self.prompts)


class GreedySettings(Settings):
    """The greedy check's settings (a mixin of the server targets' settings)."""

    greedy_check: GreedyCheck | None = None
    """Off unless set: fixed prompts completed greedily once per trial and compared with the baseline's (see
    :mod:`tuner.targets.server.greedy`)."""
    greedy_reference: dict[str, Any] | None = None
    """Set by the search for one trial: the stored reference completions (absent: none is stored yet)."""
    greedy_is_baseline: bool = False
    """Set by the search for one trial: this trial is the baseline (its agreement is 1.0 by definition)."""


@dataclass
class Completion:
    text: str
    token_ids: list[int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Completion:
        ids = d.get("token_ids")
        return cls(str(d.get("text") or ""), [int(t) for t in ids] if ids is not None else None)


def reference_key(check: GreedyCheck, *, api: str, model: str) -> str:
    """What a reference is valid for: the prompts, the tokens, the endpoint and the model."""
    doc = {"prompts": check.prompt_list(), "tokens": check.tokens, "api": api, "model": model}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def artifact_name(key: str) -> str:
    return f"greedy_reference-{key}.json"


def prompt_agreement(ref: Completion, out: Completion) -> float:
    """The common prefix of ``out`` and ``ref`` over the longer of the two: token ids when both have them, else
    characters of text; 1.0 when both are empty."""
    a, b = (
        (ref.token_ids, out.token_ids)
        if ref.token_ids is not None and out.token_ids is not None
        else (ref.text, out.text)
    )
    longest = max(len(a), len(b))
    if longest == 0:
        return 1.0
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n / longest


def agreement(ref: list[Completion], out: list[Completion]) -> float:
    """The mean of :func:`prompt_agreement` over the prompts (0.0 when the counts differ)."""
    if len(ref) != len(out) or not ref:
        return 0.0
    return sum(prompt_agreement(r, o) for r, o in zip(ref, out)) / len(ref)


class GreedyRequestError(Exception):
    """A greedy request failed; ``status`` is the HTTP status when the server answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _body(prompt: str, *, api: str, model: str, tokens: int, ids: bool) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": model, "max_tokens": tokens, "temperature": 0.0, "stream": False}
    if ids:
        body[REQUEST_FIELD] = True
    if api == "chat":
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**body, "prompt": prompt}


def _completion(doc: dict[str, Any]) -> Completion:
    choice = (doc.get("choices") or [{}])[0]
    text = choice.get("text")
    if text is None:
        text = (choice.get("message") or {}).get("content") or ""
    ids = choice.get("token_ids")
    return Completion(str(text), [int(t) for t in ids] if isinstance(ids, list) else None)


def complete(
    base_url: str, prompts: list[str], *, api: str, model: str, tokens: int, deadline: float, timeout_s: float = 600.0
) -> tuple[list[Completion], bool]:
    """Each prompt's greedy completion, one request at a time; and whether every completion carries token ids
    (False when the server refused :data:`REQUEST_FIELD`, or accepted it and sent none). :class:`GreedyRequestError`
    when a request fails."""
    ids = True
    out: list[Completion] = []
    with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0), trust_env=False) as client:
        i = 0
        while i < len(prompts):
            left = deadline - time.time()
            if left <= 0:
                raise GreedyRequestError(f"the deadline came after {i} of {len(prompts)} greedy prompts")
            path, body = _body(prompts[i], api=api, model=model, tokens=tokens, ids=ids)
            try:
                resp = client.post(base_url + path, json=body, timeout=min(timeout_s, left))
            except (httpx.HTTPError, OSError) as exc:
                raise GreedyRequestError(f"greedy prompt {i}: {type(exc).__name__}: {exc}"[:300]) from None
            if resp.status_code != 200:
                text = resp.text[:300]
                if ids and 400 <= resp.status_code < 500 and REQUEST_FIELD in text:
                    _logger.info("the server refuses `%s`: the greedy check compares text", REQUEST_FIELD)
                    ids = False
                    continue
                raise GreedyRequestError(f"greedy prompt {i}: HTTP {resp.status_code}: {text}", resp.status_code)
            try:
                out.append(_completion(resp.json()))
            except (ValueError, TypeError, AttributeError) as exc:
                raise GreedyRequestError(f"greedy prompt {i}: not a completion ({exc})") from None
            i += 1
    return out, ids and all(c.token_ids is not None for c in out)


@dataclass
class CheckResult:
    """One trial's greedy check: its completions, its agreement, the rows it stores, and why it is wrong."""

    completions: list[Completion]
    agreement: float
    own_reference: bool
    seconds: float
    rows: list[MetricRow] = field(default_factory=list)
    wrong: str = ""
    token_ids: bool = False
    """Whether the completions carry token ids (else they are compared as text)."""


def judge(
    check: GreedyCheck,
    completions: list[Completion],
    reference: list[Completion] | None,
    *,
    is_baseline: bool,
    seconds: float = 0.0,
) -> CheckResult:
    """The agreement of ``completions`` with ``reference`` (1.0 for the baseline, and for a trial that becomes the
    reference because none is stored) and the verdict against ``check.min_agreement``."""
    own = reference is None
    if is_baseline or own:
        rate = 1.0
        if is_baseline and reference is not None:
            measured = agreement(reference, completions)
            if measured < 1.0:
                _logger.warning(
                    "greedy check: the baseline's completions agree with the stored reference on %.3f "
                    "only: the server is not deterministic at temperature 0",
                    measured,
                )
    else:
        rate = agreement(reference, completions)
    rows = [
        MetricRow("greedy_agreement", "", rate, "fraction"),
        MetricRow("greedy_min_agreement", "", check.min_agreement, "fraction"),
        MetricRow("greedy_s", "", seconds, "s"),
        MetricRow("constraint", constraint_name(check), check.min_agreement - rate, ""),
    ]
    if own:
        rows.append(MetricRow("greedy_reference", "", 1.0, "flag"))
        _logger.info("greedy check: no baseline completions are stored yet; this trial's own are the reference")
    wrong = ""
    if rate < check.min_agreement:
        n = len(completions)
        wrong = (
            f"greedy completions agree with the baseline's on {rate:.3f} of the first {check.tokens} tokens "
            f"(mean common prefix over {n} prompt{'s' if n != 1 else ''}) < min_agreement "
            f"{check.min_agreement:g} (setting greedy_check.min_agreement)"
        )
    return CheckResult(completions, rate, own, seconds, rows, wrong)


def constraint_name(check: GreedyCheck) -> str:
    """The level of the check's ``constraint`` row: ``greedy_agreement>=0.9``."""
    return f"greedy_agreement>={check.min_agreement:g}"


def reference_doc(
    completions: list[Completion],
    *,
    key: str,
    trial: int | None,
    is_baseline: bool,
    prompts: list[str],
    tokens: int,
    token_ids: bool,
) -> dict[str, Any]:
    return {
        "key": key,
        "trial": trial,
        "is_baseline": is_baseline,
        "prompts": prompts,
        "tokens": tokens,
        "token_ids": token_ids,
        "completions": [c.to_json() for c in completions],
    }


def stored_reference(repo: Any, run_id: int, key: str) -> dict[str, Any] | None:
    """The reference stored in the study's storage for ``key``, or ``None``."""
    art = repo.get_artifact(run_id, artifact_name(key))
    if art is None:
        return None
    try:
        return json.loads(bytes(art.content).decode())
    except (ValueError, UnicodeDecodeError):
        _logger.warning("greedy check: the stored reference %s cannot be read; the next trial stores its own", art.name)
        return None


def store_reference(repo: Any, run_id: int, doc: dict[str, Any]) -> bool:
    """Keep ``doc`` as the study's reference unless one is stored already (the first stays); True when kept."""
    key = doc["key"]
    if stored_reference(repo, run_id, key) is not None:
        return False
    name = artifact_name(key)
    repo.add_artifacts(run_id, [(ARTIFACT_KIND, name, "", json.dumps(doc, sort_keys=True).encode())])
    _logger.info("greedy check: trial %s's completions are the study's reference (%s)", doc.get("trial"), name)
    return True


def completions_of(doc: dict[str, Any]) -> list[Completion]:
    return [Completion.from_json(c) for c in doc.get("completions") or []]
