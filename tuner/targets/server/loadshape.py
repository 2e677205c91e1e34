"""Load shapes: the prompt and output lengths of the requests a server is measured with.

- ``fixed``: every request ``prompt_len`` words and ``output_len`` tokens (``length_jitter`` > 0: each length uniform
  in ``[1 - j, 1 + j]`` times its value, the older spelling of a spread).
- ``distribution``: lengths drawn around ``prompt_len``/``output_len`` with standard deviations
  ``prompt_len_std``/``output_len_std`` (``length_distribution``: ``lognormal``, the usual shape of chat traffic,
  or ``normal``), clipped to at least 1, seeded.
- ``replay``: the rows of a JSONL request file (``dataset``), cycled: each row a ``prompt`` (or ``messages``, or
  ``text``) and its output length (``output_len``, ``output_length`` or ``max_tokens``); a row with only lengths
  (``prompt_len``/``input_len``/``input_length``, as traces and SGLang's bench_serving random datasets record them)
  becomes a synthetic prompt of that many words.

The shape is recorded with each trial (rows at level ``load:<shape>``: the mean and spread of the lengths sent) and,
through its settings, in the export's recorded load.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from storage.types import MetricRow
from tuner.errors import SettingsError
from tuner.settings import Settings

SHAPES = ("fixed", "distribution", "replay")
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "far", "away")
_PROMPT_KEYS = ("messages", "prompt", "text")
_PROMPT_LEN_KEYS = ("prompt_len", "input_len", "input_length")
_OUTPUT_LEN_KEYS = ("output_len", "output_length", "max_tokens")


class LoadShapeSettings(Settings):
    """The shape's own settings (the means are ``prompt_len``/``output_len``, the file ``dataset``)."""

    load_shape: Literal["fixed", "distribution", "replay"] | None = None
    """Unset: ``replay`` when ``dataset`` is given, ``distribution`` when a ``*_std`` is, else ``fixed``."""
    length_distribution: Literal["lognormal", "normal"] | None = None
    prompt_len_std: float | None = Field(None, ge=0)
    output_len_std: float | None = Field(None, ge=0)


Prompt = str | list[dict[str, str]]


@dataclass(frozen=True)
class LoadShape:
    kind: str = "fixed"
    prompt_len: int = 256
    output_len: int = 128
    length_jitter: float = 0.0
    prompt_len_std: float = 0.0
    output_len_std: float = 0.0
    distribution: str = "lognormal"
    dataset: str | None = None

    @classmethod
    def from_settings(
        cls, settings: dict[str, Any], prompt_len: int, output_len: int, length_jitter: float
    ) -> LoadShape:
        """The shape ``settings`` ask for (one-line :class:`SettingsError` when they contradict each other)."""
        dataset = settings.get("dataset")
        p_std, o_std = settings.get("prompt_len_std"), settings.get("output_len_std")
        kind = settings.get("load_shape") or ("replay" if dataset else "distribution" if (p_std or o_std) else "fixed")
        if kind not in SHAPES:
            raise SettingsError(f"setting `load_shape` must be one of {list(SHAPES)}, but got {kind!r}")
        if kind == "replay" and not dataset:
            raise SettingsError(
                "setting `load_shape: replay` needs setting `dataset` (a JSONL request file); give --set dataset=PATH"
            )
        if kind != "replay" and dataset:
            raise SettingsError(
                f"setting `dataset` ({dataset!r}) is a replayed load, but `load_shape` is {kind!r}; drop one of them"
            )
        if kind != "distribution" and (p_std or o_std):
            raise SettingsError(
                f"settings `prompt_len_std`/`output_len_std` shape a `distribution` load, but "
                f"`load_shape` is {kind!r}; set `load_shape: distribution` or drop them"
            )
        if kind == "distribution" and length_jitter:
            raise SettingsError(
                "settings `length_jitter` and `load_shape: distribution` both spread the lengths; "
                "use `prompt_len_std`/`output_len_std` only"
            )
        shape = cls(
            kind=kind,
            prompt_len=prompt_len,
            output_len=output_len,
            length_jitter=length_jitter,
            prompt_len_std=float(p_std or 0.0),
            output_len_std=float(o_std or 0.0),
            distribution=settings.get("length_distribution") or "lognormal",
            dataset=dataset,
        )
        if kind == "replay":
            load_rows(str(dataset))  # a bad file is refused before any trial
        return shape

    # -- the requests -----------------------------------------------------------------------------------------------
    def requests(self, count: int, seed: int, offset: int = 0) -> list[tuple[Prompt, int]]:
        """``count`` requests as (prompt, max_tokens): rows ``offset``.. of the replayed file (cycled), else drawn
        from a generator seeded with ``seed + offset``."""
        rng = random.Random(seed + offset)
        if self.kind == "replay":
            rows = load_rows(str(self.dataset))
            out = []
            for i in range(count):
                row = rows[(offset + i) % len(rows)]
                out.append((row_prompt(row, rng), row_output_len(row, self.output_len)))
            return out
        out = []
        for _ in range(count):  # the draws in the order loadgen made them before shapes (same seed, same load)
            n = self._length(self.prompt_len, self.prompt_len_std, rng)
            words = " ".join([rng.choice(WORDS) for _ in range(n)])
            out.append((words, self._length(self.output_len, self.output_len_std, rng)))
        return out

    def _length(self, mean: int, std: float, rng: random.Random) -> int:
        if self.kind == "fixed":
            j = self.length_jitter
            return max(1, round(mean * rng.uniform(1 - j, 1 + j))) if j else max(1, mean)
        if std <= 0:
            return max(1, mean)
        if self.distribution == "normal":
            return max(1, round(rng.gauss(mean, std)))
        sigma2 = math.log(1 + (std / mean) ** 2)
        return max(1, round(rng.lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))))

    # -- the record -------------------------------------------------------------------------------------------------
    def rows(self, seed: int, sample: int = 2000) -> list[MetricRow]:
        """The shape's figures: mean and spread of the prompt and output lengths over ``sample`` requests drawn as
        the load draws them (of a replayed file, over its rows), at level ``load:<shape>``."""
        level = f"load:{self.kind}"
        reqs = self.requests(sample if self.kind != "replay" else len(load_rows(str(self.dataset))), seed)
        plen = [
            len(p.split()) if isinstance(p, str) else sum(len(m.get("content", "").split()) for m in p) for p, _ in reqs
        ]
        olen = [m for _, m in reqs]
        out = [
            MetricRow("prompt_len_mean", level, statistics.fmean(plen), "words"),
            MetricRow("prompt_len_std", level, statistics.pstdev(plen), "words"),
            MetricRow("output_len_mean", level, statistics.fmean(olen), "tokens"),
            MetricRow("output_len_std", level, statistics.pstdev(olen), "tokens"),
        ]
        if self.kind == "replay":
            out.append(MetricRow("dataset_rows", level, float(len(reqs)), "count"))
        return out

    def describe(self) -> str:
        if self.kind == "replay":
            return (
                f"replay of {self.dataset} ({len(load_rows(str(self.dataset)))} rows, sha256 "
                f"{dataset_digest(str(self.dataset))[:12]})"
            )
        if self.kind == "distribution":
            return (
                f"{self.distribution} lengths: prompt {self.prompt_len}±{self.prompt_len_std:g}, output "
                f"{self.output_len}±{self.output_len_std:g}"
            )
        jitter = f" (±{self.length_jitter:.0%} uniform)" if self.length_jitter else ""
        return f"fixed lengths: prompt {self.prompt_len}, output {self.output_len}{jitter}"


# -- the request file ---------------------------------------------------------------------------------------------
def _int_of(row: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for k in keys:
        if row.get(k) is not None:
            return int(row[k])
    return None


def row_prompt(row: dict[str, Any], rng: random.Random) -> Prompt:
    for k in _PROMPT_KEYS:
        if row.get(k):
            return row[k]
    return " ".join(rng.choice(WORDS) for _ in range(_int_of(row, _PROMPT_LEN_KEYS) or 1))


def row_output_len(row: dict[str, Any], default: int) -> int:
    return _int_of(row, _OUTPUT_LEN_KEYS) or default


@lru_cache(maxsize=8)
def load_rows(path: str) -> tuple[dict[str, Any], ...]:
    """The rows of a JSONL request file; :class:`SettingsError` naming the file, the line and the fix."""
    rows = []
    try:
        text = Path(path).expanduser().read_text()
    except OSError as exc:
        raise SettingsError(
            f"setting `dataset`: cannot read {path!r} ({exc.strerror}); give a JSONL request file"
        ) from None
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SettingsError(
                f"setting `dataset`: {path}:{i}: not a JSON line ({exc.msg}); one JSON object per line"
            ) from None
        if isinstance(row, str):
            row = {"prompt": row}
        if not isinstance(row, dict) or not any(row.get(k) for k in _PROMPT_KEYS + _PROMPT_LEN_KEYS):
            raise SettingsError(
                f"setting `dataset`: {path}:{i}: a row needs `prompt`, `messages` or a prompt "
                f"length (`prompt_len`/`input_len`), got {str(row)[:80]!r}"
            )
        for keys in (_PROMPT_LEN_KEYS, _OUTPUT_LEN_KEYS):
            try:
                n = _int_of(row, keys)
            except (TypeError, ValueError):
                n = -1
            if n is not None and n < 1:
                raise SettingsError(
                    f"setting `dataset`: {path}:{i}: `{next(k for k in keys if k in row)}` must be "
                    f"a positive integer, got {str(row)[:80]!r}"
                )
        rows.append(row)
    if not rows:
        raise SettingsError(f"setting `dataset`: {path} has no request; give one JSON object per line")
    return tuple(rows)


@lru_cache(maxsize=8)
def dataset_digest(path: str) -> str:
    return hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()
