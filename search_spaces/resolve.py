"""Resolve a space for one machine: drop what this hardware cannot run, say why, and fix up the defaults."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from search_spaces.hardware import CAPABILITIES, Hardware
from search_spaces.schema import Param, Space

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Inactive:
    """A parameter (``value is None``) or one value of it that will never be sampled here, and why."""

    param: str
    value: Any
    reason: str

    def __str__(self) -> str:
        what = f"`{self.param}`" if self.value is None else f"`{self.param}={self.value}`"
        return f"{what} inactive: {self.reason}"


@dataclass(frozen=True)
class ResolvedSpace:
    space: Space
    hardware: Hardware
    params: tuple[Param, ...]
    """Parameters that can vary here, with their values cut to what this machine runs."""
    fixed: dict[str, Any]
    """Parameters pinned to a value here (inactive as a whole, or a single runnable value)."""
    inactive: tuple[Inactive, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    dropped: frozenset[str] = frozenset()
    """Parameters inactive as a whole here: never sampled and left out of every trial's params."""

    def walk(self, choose: Callable[[Param], Any]) -> dict[str, Any]:
        """One configuration, built in declaration order: a parameter whose condition holds takes its fixed value
        here, or ``choose(param)`` (the resolved param, values cut to this machine); dropped ones are left out."""
        out: dict[str, Any] = {}
        by_name = {p.name: p for p in self.params}
        for p in self.space.params:
            if p.name in self.dropped or (p.when is not None and not p.when.holds(out)):
                continue
            out[p.name] = self.fixed[p.name] if p.name in self.fixed else choose(by_name[p.name])
        return out

    def defaults(self) -> dict[str, Any]:
        """The baseline on this machine: the space's defaults, with unrunnable ones replaced (see ``notes``)."""
        return self.walk(lambda p: p.default)


def resolve(space: Space, hardware: Hardware, *, deployable_only: bool = False) -> ResolvedSpace:
    """Cut ``space`` to ``hardware``. A parameter whose every value needs something missing is pinned. With
    ``deployable_only``, also every value the exported SGLang command cannot give on this GPU (a value its
    ``server:`` marks ``not_deployable`` here, or not its ``deploys_as``): the search's best is then the command.
    On a GPU the space's deployment map covers, each default is what the deployment runs there, where it can run."""
    params: list[Param] = []
    fixed: dict[str, Any] = {}
    inactive: list[Inactive] = []
    notes: list[str] = []
    deployed = _deployed_baseline(space, hardware, notes)
    dropped: set[str] = set()
    for p in space.params:
        missing = hardware.missing(p.requires)
        if missing:
            inactive.append(Inactive(p.name, None, _why(missing)))
            dropped.add(p.name)
            continue
        if p.when is not None:
            cannot = _condition_cannot_hold(p, params, fixed, dropped)
            if cannot:
                inactive.append(Inactive(p.name, None, cannot))
                dropped.add(p.name)
                continue
        if p.type == "float":
            params.append(p)
            continue
        keep = []
        for v in p.choices():
            miss = hardware.missing(p.value_requires.get(v, ()))
            blocker = p.server.blocker(v, hardware.arch) if deployable_only and p.server else None
            if miss:
                inactive.append(Inactive(p.name, v, _why(miss)))
            elif blocker is not None:
                inactive.append(
                    Inactive(p.name, v, f"deployable_only: the command cannot set it ({blocker.describe()})")
                )
            else:
                keep.append(v)
        wanted = deployed.get(p.name, p.default)
        default = wanted
        if default not in keep:
            mark = p.server.blocker(default, hardware.arch) if deployable_only and p.server else None
            runnable = not hardware.missing(p.value_requires.get(wanted, ()))
            fallback = p.default if p.default in keep else (keep[0] if keep else wanted if runnable else p.default)
            default = mark.instead if mark is not None and mark.instead in keep else fallback
            miss = hardware.missing(p.value_requires.get(wanted, ()))
            why = _why(miss) if miss else "deployable_only: the exported command cannot set it"
            if not keep and default == wanted:  # nothing runnable is deployable: the twin keeps a stand-in
                notes.append(
                    f"`{p.name}`: no value the exported command runs can run here; the twin runs {default!r} in its "
                    f"place ({why})"
                )
            else:
                notes.append(f"`{p.name}` default {wanted!r} cannot run here ({why}); the baseline uses {default!r}")
        elif p.name in deployed and wanted != p.default:
            notes.append(
                f"`{p.name}`: the baseline runs {wanted!r}, what {space.deployment.release} runs on "
                f"{hardware.arch} (the space's default is {p.default!r})"
            )
        if len(keep) <= 1:
            fixed[p.name] = default
            if keep:
                notes.append(f"`{p.name}` has one runnable value here: {default!r}")
            continue
        params.append(
            replace(p, values=tuple(keep), type="categorical" if p.type != "buckets" else "buckets", default=default)
            if p.type in ("categorical", "buckets", "bool", "int", "pow2") and len(keep) != len(p.choices())
            else replace(p, default=default)
        )
    for item in inactive:
        _logger.info("%s", item)
    return ResolvedSpace(
        space=space,
        hardware=hardware,
        params=tuple(params),
        fixed=fixed,
        inactive=tuple(inactive),
        notes=tuple(notes),
        dropped=frozenset(dropped),
    )


def _deployed_baseline(space: Space, hardware: Hardware, notes: list[str]) -> dict[str, Any]:
    """The knob values of the deployment's default path on this GPU, one run (component) at a time: a run whose
    values cannot all run here keeps the space's defaults for its knobs, with a note naming the missing piece."""
    if space.deployment is None:
        return {}
    out: dict[str, Any] = {}
    by_name = {p.name: p for p in space.params}
    for run in space.deployment.default_runs(hardware.arch):
        if not run.twin:
            continue
        missing = sorted(
            {
                m
                for knob, value in run.twin.items()
                for m in hardware.missing(by_name[knob].requires + tuple(by_name[knob].value_requires.get(value, ())))
            }
        )
        if (
            missing
            and run.fallback is not None
            and not hardware.missing(
                tuple(m for knob, value in run.fallback.items() for m in by_name[knob].value_requires.get(value, ()))
            )
        ):
            values = ", ".join(f"{k}={v}" for k, v in run.twin.items())
            notes.append(
                f"{space.deployment.release} runs {run.component} on {hardware.arch} as {values}, which cannot run "
                f"here ({_why(missing)}); the baseline runs the stand-in "
                + ", ".join(f"{k}={v}" for k, v in run.fallback.items())
                + f" ({run.stand_in})"
            )
            out.update(run.fallback)
            continue
        if missing:
            values = ", ".join(f"{k}={v}" for k, v in run.twin.items())
            notes.append(
                f"{space.deployment.release} runs {run.component} on {hardware.arch} as {values}, which cannot "
                f"run here ({_why(missing)}); the baseline keeps the space's defaults for it"
            )
            continue
        out.update(run.twin)
    return out


def _condition_cannot_hold(p: Param, params: list[Param], fixed: dict[str, Any], dropped: set[str]) -> str | None:
    by_name = {q.name: q for q in params}
    for name, allowed in p.when.clauses:
        if name in dropped:
            return f"its condition on `{name}` cannot hold here (`{name}` is inactive)"
        if name in fixed and fixed[name] not in allowed:
            return f"its condition `{name}` in {list(allowed)} cannot hold here (`{name}` is {fixed[name]!r})"
        if name in by_name and not set(by_name[name].choices()) & set(allowed):
            return f"its condition `{name}` in {list(allowed)} cannot hold here"
    return None


def _why(missing: list[str]) -> str:
    return "needs " + ", ".join(f"{m} ({CAPABILITIES[m]})" for m in missing)
