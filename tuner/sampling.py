"""Turn a resolved space into Optuna suggestions (define-by-run: conditional parameters only when active)."""

from __future__ import annotations

import json
from typing import Any

import optuna

from search_spaces import ResolvedSpace


def suggest(trial: optuna.Trial, resolved: ResolvedSpace) -> dict[str, Any]:
    """Sample one configuration: every active parameter in declaration order, fixed ones at their value."""
    params: dict[str, Any] = {}
    by_name = {p.name: p for p in resolved.params}
    for p in resolved.space.params:
        if p.name in resolved.dropped or (p.when is not None and not p.when.holds(params)):
            continue
        if p.name in resolved.fixed:
            params[p.name] = resolved.fixed[p.name]
            continue
        rp = by_name[p.name]
        if rp.type == "float":
            step = rp.step if not rp.log else None
            params[p.name] = trial.suggest_float(p.name, rp.low, rp.high, log=rp.log, step=step)
        elif rp.type == "int" and not rp.values:
            params[p.name] = trial.suggest_int(p.name, int(rp.low), int(rp.high), step=int(rp.step or 1),
                                               log=rp.log)
        else:
            params[p.name] = trial.suggest_categorical(p.name, list(rp.choices()))
    return params


def suggestable(resolved: ResolvedSpace, params: dict[str, Any]) -> dict[str, Any]:
    """The part of ``params`` that Optuna samples (for ``enqueue_trial``): no fixed or dropped parameters."""
    active = {p.name for p in resolved.params}
    return {k: v for k, v in params.items() if k in active}


def params_key(params: dict[str, Any]) -> str:
    """A stable identity of a configuration, for finding repeats."""
    return json.dumps(params, sort_keys=True, default=str)
