"""Turn a resolved space into Optuna suggestions (define-by-run: conditional parameters only when active)."""

from __future__ import annotations

import json
from typing import Any

import optuna

from search_spaces import Param, ResolvedSpace


def suggest(trial: optuna.Trial, resolved: ResolvedSpace) -> dict[str, Any]:
    """Sample one configuration: every active parameter in declaration order, fixed ones at their value."""

    def choose(p: Param) -> Any:
        if p.type == "float":
            return trial.suggest_float(p.name, p.low, p.high, log=p.log, step=None if p.log else p.step)
        if p.type == "int" and not p.values:
            return trial.suggest_int(p.name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        return trial.suggest_categorical(p.name, list(p.choices()))

    return resolved.walk(choose)


def suggestable(resolved: ResolvedSpace, params: dict[str, Any]) -> dict[str, Any]:
    """The part of ``params`` that Optuna samples (for ``enqueue_trial``): no fixed or dropped parameters."""
    active = {p.name for p in resolved.params}
    return {k: v for k, v in params.items() if k in active}


def params_key(params: dict[str, Any]) -> str:
    """A stable identity of a configuration, for finding repeats."""
    return json.dumps(params, sort_keys=True, default=str)
