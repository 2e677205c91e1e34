"""How trials are sampled: the sampler and pruner every process of a study uses, the constraints that teach the
sampler from failures, and a resolved space turned into Optuna suggestions (define-by-run: conditional parameters
only when active)."""

from __future__ import annotations

import json
import warnings
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


_HAS_SET_CONSTRAINT = hasattr(optuna.trial.Trial, "set_constraint")  # Optuna >= 5; constraints_func before


def make_sampler(resolved: ResolvedSpace, seed: int | None, *,
                 parallel: bool = True) -> optuna.samplers.BaseSampler:
    """The sampler every process of a study uses: multivariate TPE grouped for conditional parameters, learning
    from failures through constraints; with several workers (``parallel``) a constant liar keeps them apart (it
    costs about a third more sampling time, so a single worker goes without)."""
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna.samplers.TPESampler(
        seed=seed, multivariate=True, group=True, constant_liar=parallel,
        n_startup_trials=max(5, min(10, len(resolved.params) + 2)),
        **({} if _HAS_SET_CONSTRAINT else {"constraints_func": _constraints_of}),
    )


def make_pruner() -> optuna.pruners.BasePruner:
    # keep the top 90% at each level: prune only a clearly bad trial, after the first level (c=1 says little)
    return optuna.pruners.PercentilePruner(90.0, n_startup_trials=5, n_warmup_steps=1)


def _constraints_of(frozen: optuna.trial.FrozenTrial) -> list[float]:
    return list(frozen.user_attrs.get("constraints", [0.0]))


def set_constraints(trial: optuna.Trial, values: list[float]) -> None:
    """Feasibility for the sampler: every value <= 0 is feasible. Kept in user attrs for the API as well."""
    trial.set_user_attr("constraints", values)
    if _HAS_SET_CONSTRAINT:
        for i, v in enumerate(values):
            trial.set_constraint(f"c{i}", v)
