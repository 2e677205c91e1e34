"""Typed objects of a search space. Construction validates; errors name the file, the parameter, the value, the fix.

A space is data: parameters (type, values or range, default, where the value goes, an optional condition on other
parameters, hardware requirements), named constraints between parameters, and an objective. Nothing in a space is
evaluated as code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from search_spaces.buckets import DENSITIES, expand_buckets
from search_spaces.hardware import CAPABILITIES

PARAM_TYPES = ("int", "pow2", "float", "categorical", "bool", "buckets")
COMBINES = ("geomean", "level", "min", "mean")
SLO_BASES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
SLO_QUANTILES = ("p50", "p90", "p95", "p99")
SLO_METRICS = tuple(f"{b}_{q}" for b in SLO_BASES for q in SLO_QUANTILES)
"""What a latency SLO may limit: time to first token, time per output token, inter-token gap, end to end."""
GOODPUT_METRICS = ("goodput_req_s", "goodput_tok_s", "goodput_req_s_per_gpu", "goodput_tok_s_per_gpu")
"""Objective metrics of a goodput search: the most load a configuration serves within its SLO."""
PARETO_METRICS = ("tok_s_per_request",)
"""Second objectives of the multi-objective mode: per-user speed at the goodput's boundary (level ``slo``)."""
SLO_LEVEL = "slo"
"""The level of the SLO's constraint rows: each limit measured at the boundary found (or the lowest load tried)."""


class SpaceError(ValueError):
    """A search space is invalid. The message is one line: where, what, the value, and the fix."""


def _fail(where: str, what: str, value: Any, fix: str) -> SpaceError:
    return SpaceError(f"{where}: {what} (got {value!r}); {fix}")


@dataclass(frozen=True)
class Condition:
    """Active only when every named parameter's value is in its list: ``when: {attention_impl: [mma]}``."""

    clauses: tuple[tuple[str, tuple[Any, ...]], ...]

    def holds(self, params: dict[str, Any]) -> bool:
        return all(name in params and params[name] in allowed for name, allowed in self.clauses)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.clauses)


DEPLOY_KINDS = {
    "declined": "SGLang declines the flag on this GPU (it logs a reason and runs its own path instead)",
    "fails": "known to fail in SGLang",
    "code_change": "a change to SGLang's code (no flag or variable sets it)",
}
"""Why the exported command cannot give a knob value (``server: {not_deployable: {value: {kind: ...}}}``)."""


@dataclass(frozen=True)
class NotDeployable:
    """A knob value the exported SGLang command cannot give: ``kind`` (:data:`DEPLOY_KINDS`), ``why``, the ``source``
    it is known from, ``instead`` (the knob value SGLang runs in its place), ``except_on`` (GPU architectures,
    e.g. ``gfx950`` or ``sm_90``, where the command does give it) and ``only_on`` (where set, the only
    architectures the mark holds on: SGLang runs another kernel for that component there)."""

    kind: str
    why: str
    source: str
    instead: Any
    except_on: tuple[str, ...] = ()
    only_on: tuple[str, ...] = ()

    def applies(self, arch: str | None) -> bool:
        """Whether the command cannot give the value on a GPU of architecture ``arch`` (None: unknown)."""
        if self.only_on:
            return bool(arch) and arch in self.only_on
        return not (arch and arch in self.except_on)

    def describe(self) -> str:
        where = (
            f" (except on {', '.join(self.except_on)})"
            if self.except_on
            else f" (on {', '.join(self.only_on)})"
            if self.only_on
            else ""
        )
        return f"{self.kind.replace('_', ' ')}{where}: {self.why} [source: {self.source}]"


@dataclass(frozen=True)
class ServerCounterpart:
    """What sets the same thing as a workload knob in a real SGLang deployment: a launch ``flag``, an ``env``
    variable, or nothing (``none``: the reason). ``values`` maps a knob value to the server's value when they are
    spelled differently (``{triton: true}``); a value mapped to ``null`` leaves the flag out (the server's default).
    ``see`` lists related flags or variables that do not set the same thing (named in the export, checked too)."""

    flag: str | None = None
    env: str | None = None
    none: str = ""
    """Why there is no counterpart (set only when ``flag`` and ``env`` are not)."""
    values: dict[Any, Any] = field(default_factory=dict)
    note: str = ""
    see: tuple[str, ...] = ()
    not_deployable: dict[Any, NotDeployable] = field(default_factory=dict)
    """Knob values the exported command cannot give (declined, known to fail, or a code change), each with its
    source and what SGLang runs instead."""
    deploys_as: Any = None
    """With ``none``: the knob value SGLang's own code runs (the checkpoint's dtype, its library GEMM); every other
    value is a code change (the ``none`` text says why). With a ``flag``: what SGLang runs when the flag is left at its
    default (a value ``values`` maps to ``null``); another such value is a code change (the ``note`` says why), a value
    the flag sets is deployable. ``None``: not stated."""
    deploys_as_on: dict[str, Any] = field(default_factory=dict)
    """Where SGLang's own code runs another value on some GPU architectures (``deploys_as: {sm_90: deepgemm,
    default: torch}``): that value there, ``deploys_as`` elsewhere."""

    def deployed_value(self, arch: str | None = None) -> Any:
        """The value SGLang's own code runs for a flagless knob on a GPU of architecture ``arch``."""
        return self.deploys_as_on.get(arch, self.deploys_as) if arch else self.deploys_as

    @property
    def name(self) -> str | None:
        return self.flag or self.env

    def blocker(self, value: Any, arch: str | None = None) -> NotDeployable | None:
        """Why the command cannot give ``value`` on a GPU of architecture ``arch``; ``None`` when it can."""
        mark = self.not_deployable.get(value)
        if mark is not None:
            return mark if mark.applies(arch) else None
        deployed = self.deployed_value(arch)
        if deployed is None or value == deployed:
            return None
        if not self.flag and not self.env:
            return NotDeployable("code_change", self.none, "this space's `server: none`", deployed)
        if self.flag and self.server_value(value) is None:  # the flag left at its default: SGLang runs `deployed`
            return NotDeployable(
                "code_change", self.note, f"this space's `server: deploys_as` ({self.flag} left out)", deployed
            )
        return None

    def server_value(self, value: Any) -> Any:
        """The server's value for a knob value (the same value unless ``values`` maps it; ``None``: leave out)."""
        return self.values.get(value, value) if self.values else value

    def describe(self) -> str:
        if self.flag:
            return f"flag {self.flag}"
        if self.env:
            return f"env {self.env}"
        return f"no server counterpart: {self.none}"


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    default: Any
    values: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    description: str = ""
    flag: str | None = None
    """A server flag this parameter becomes (``--context-length``); for the sglang target."""
    kernel: str | None = None
    """A kernel config field (``sparse_decode.num_splits``)."""
    env: str | None = None
    """An environment variable of the launched process."""
    server: ServerCounterpart | None = None
    """For workload knobs: the SGLang flag or variable that sets the same thing in a deployment, or why none does."""
    when: Condition | None = None
    requires: tuple[str, ...] = ()
    value_requires: dict[Any, tuple[str, ...]] = field(default_factory=dict)

    @property
    def goes_to(self) -> str:
        if self.flag:
            return f"flag {self.flag}"
        if self.kernel:
            return f"kernel {self.kernel}"
        if self.env:
            return f"env {self.env}"
        return "workload knob"

    def choices(self) -> tuple[Any, ...]:
        """Every value of a discrete parameter; ``()`` for a continuous one."""
        if self.type in ("categorical", "buckets"):
            return self.values
        if self.type == "bool":
            return (False, True)
        if self.type == "pow2":
            out, v = [], int(self.low)
            while v <= self.high:
                out.append(v)
                v *= 2
            return tuple(out)
        if self.type == "int":
            step = int(self.step or 1)
            return tuple(range(int(self.low), int(self.high) + 1, step))
        return ()

    def contains(self, value: Any) -> bool:
        if self.type == "float":
            return isinstance(value, (int, float)) and self.low <= value <= self.high
        return value in self.choices()


@dataclass(frozen=True)
class Constraint:
    """A named rule: when every ``if`` clause holds, each ``then`` parameter must take one of its values."""

    name: str
    when: Condition
    then: tuple[tuple[str, tuple[Any, ...]], ...]
    message: str = ""

    def violated(self, params: dict[str, Any]) -> bool:
        if not self.when.holds(params):
            return False
        return any(name in params and params[name] not in allowed for name, allowed in self.then)


@dataclass(frozen=True)
class LevelConstraint:
    """A limit on one metric at one level (``tok_s`` at concurrency 1 >= 20): an Optuna constraint."""

    metric: str
    level: str
    min: float | None = None
    max: float | None = None

    def violation(self, value: float) -> float:
        """> 0 when violated (by how much), <= 0 when satisfied; Optuna's constraint convention."""
        over = (value - self.max) if self.max is not None else -math.inf
        under = (self.min - value) if self.min is not None else -math.inf
        return max(over, under)


@dataclass(frozen=True)
class Objective:
    metric: str = "tok_s"
    direction: str = "maximize"
    combine: str = "geomean"
    levels: tuple[int, ...] = (1, 16, 64)
    level: int | None = None
    unit: str = "tok/s"
    constraints: tuple[LevelConstraint, ...] = ()
    slo: tuple[tuple[str, float], ...] = ()
    """Latency limits of a goodput objective (``(("ttft_ms_p99", 500.0),)``); each is also a constraint at level
    :data:`SLO_LEVEL`."""
    pareto: str | None = None
    """Multi-objective mode: this metric at level :data:`SLO_LEVEL` is a second objective, maximized beside the
    goodput (throughput per GPU against per-user speed)."""

    @property
    def directions(self) -> tuple[str, ...]:
        """One direction per Optuna objective."""
        return (self.direction, "maximize") if self.pareto else (self.direction,)

    @property
    def is_goodput(self) -> bool:
        return self.metric in GOODPUT_METRICS

    def describe(self) -> str:
        if self.is_goodput:
            text = f"{self.metric} within " + ", ".join(f"{k}<={v:g}" for k, v in self.slo)
            return text + (f" against {self.pareto} (Pareto front)" if self.pareto else "")
        if self.combine == "level":
            return f"{self.metric} at c={self.level}"
        return f"{self.combine} of {self.metric} at c={','.join(map(str, self.levels))}"

    def combine_values(self, by_level: dict[int, float]) -> float:
        """Fold per-level values into one objective value."""
        if self.combine == "level":
            return by_level[self.level]
        vals = [by_level[c] for c in self.levels]
        if self.combine == "geomean":
            if any(v <= 0 for v in vals):
                return 0.0
            return math.exp(sum(math.log(v) for v in vals) / len(vals))
        if self.combine == "min":
            return min(vals)
        return sum(vals) / len(vals)


@dataclass(frozen=True)
class Space:
    name: str
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...] = ()
    objective: Objective = Objective()
    target: str = "workload"
    preset: str = "dsv4-flash"
    description: str = ""
    source: str = "<memory>"
    settings: dict[str, Any] = field(default_factory=dict)
    """Target settings that are not searched (``live_context: 512``, ``model: /path``)."""
    deployment: Any = None
    """The deployment map (:class:`search_spaces.deployment.Deployment`) whose default path is the baseline on the
    GPUs it covers; None: the space's defaults everywhere."""

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def defaults(self) -> dict[str, Any]:
        """The baseline: every parameter at its default, conditional ones only where their condition holds."""
        out: dict[str, Any] = {}
        for p in self.params:
            if p.when is None or p.when.holds(out):
                out[p.name] = p.default
        return out

    def violated_constraints(self, params: dict[str, Any]) -> list[Constraint]:
        return [c for c in self.constraints if c.violated(params)]


def check_requirements(where: str, reqs: Any) -> tuple[str, ...]:
    if isinstance(reqs, str):
        reqs = [reqs]
    if not isinstance(reqs, list):
        raise _fail(where, "`requires` must be a list of capabilities", reqs, f"use names from {sorted(CAPABILITIES)}")
    for r in reqs:
        if r not in CAPABILITIES:
            raise _fail(where, "unknown capability", r, f"use one of {sorted(CAPABILITIES)}")
    return tuple(reqs)


def check_bucket_values(where: str, values: tuple[Any, ...]) -> None:
    for v in values:
        try:
            expand_buckets(v)
        except ValueError as exc:
            raise _fail(where, f"bad bucket set: {exc}", v, f"write density:max_bs with density in {DENSITIES}")
