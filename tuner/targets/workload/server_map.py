"""From twin knobs to SGLang: the launch flags and environment variables that set the same things in a deployment.

Each workload parameter carries a ``server:`` annotation in its space (:class:`search_spaces.ServerCounterpart`):
a flag, a variable, or the reason there is none. :func:`server_launch` turns one configuration into SGLang
arguments and variables, and lists the knobs it could not carry over. :func:`check_counterparts` checks the
annotations against SGLang's own parser (flag names, the values the parser's types and choices accept) and its
environment registry.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search_spaces import Param, Space, expand_buckets

_logger = logging.getLogger(__name__)

DISABLE_DECODE_GRAPHS = "--disable-decode-cuda-graph"
COMPILE_FLAG, COMPILE_MAX_BS = "--enable-torch-compile", "--torch-compile-max-bs"


@dataclass
class ServerLaunch:
    """SGLang arguments and variables for one twin configuration."""

    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    carried: list[tuple[str, Any, list[str]]] = field(default_factory=list)
    """(knob, value, the arguments or ``NAME=value`` it became; ``[]`` when it leaves the server's default)."""
    unmapped: list[tuple[Param, Any]] = field(default_factory=list)
    """Knobs with no server counterpart, with the configuration's value."""
    unannotated: list[str] = field(default_factory=list)
    """Parameters whose space says nothing about a server counterpart."""


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def flag_args(p: Param, value: Any, *, max_batch: int) -> list[str]:
    """The arguments ``p.server.flag`` takes for the knob value ``value`` (``[]``: leave the server's default)."""
    server = p.server
    assert server is not None and server.flag
    v = server.server_value(value)
    if p.type == "buckets":
        sizes = expand_buckets(str(v))
        return [server.flag, *map(str, sizes)] if sizes else [DISABLE_DECODE_GRAPHS]
    if v is None or v is False:
        return []
    if v is True:
        out = [server.flag]
        if server.flag == COMPILE_FLAG:  # the twin compiles every batch it runs; SGLang stops at 32 by default
            out += [COMPILE_MAX_BS, str(max_batch)]
        return out
    return [server.flag, _text(v)]


def server_launch(space: Space, params: dict[str, Any]) -> ServerLaunch:
    """SGLang arguments and variables for the twin configuration ``params`` (inactive parameters are absent)."""
    out = ServerLaunch()
    max_batch = max(space.objective.levels)
    if "cuda_graph_buckets" in params:  # torch.compile above the largest captured graph is never used
        sizes = expand_buckets(str(params["cuda_graph_buckets"]))
        max_batch = min(max_batch, max(sizes)) if sizes else max_batch
    for p in space.params:
        if p.name not in params:
            continue
        value = params[p.name]
        if p.server is None:
            out.unannotated.append(p.name)
        elif p.server.flag:
            args = flag_args(p, value, max_batch=max_batch)
            out.args += args
            out.carried.append((p.name, value, args))
        elif p.server.env:
            v = p.server.server_value(value)
            if v is not None:
                out.env[p.server.env] = _text(v)
            out.carried.append((p.name, value, [] if v is None else [f"{p.server.env}={_text(v)}"]))
        else:
            out.unmapped.append((p, value))
    return out


def env_known(name: str) -> bool:
    """Whether the installed SGLang reads the variable ``name``: in its ``Envs`` registry, or named in its source."""
    try:
        from sglang.srt.environ import envs
    except ImportError:
        return False
    return hasattr(type(envs), name) or name in _names_in_source()


@functools.lru_cache(maxsize=1)
def _names_in_source() -> frozenset[str]:
    import sglang

    pattern = re.compile(r"[\"'](SGLANG_[A-Z0-9_]+)[\"']")
    names: set[str] = set()
    for f in Path(sglang.__file__).parent.rglob("*.py"):
        names.update(pattern.findall(f.read_text(errors="ignore")))
    return frozenset(names)


def check_counterparts(space: Space, flags) -> list[str]:
    """Problems of ``space``'s ``server:`` annotations against a parser's flags (``ServerFlags`` read with
    ``introspect_parser(checks=counterpart_checks(space))``) and SGLang's variables; ``[]`` when all hold."""
    problems = []
    for p in space.params:
        s = p.server
        if s is None:
            problems.append(f"param `{p.name}` has no `server:` annotation")
            continue
        names = [n for n in ([s.flag] if s.flag else []) + list(s.see) if n.startswith("-")]
        if any(s.server_value(v) is True for v in p.choices()) and s.flag == COMPILE_FLAG:
            names.append(COMPILE_MAX_BS)
        if p.type == "buckets" and any(not expand_buckets(v) for v in p.choices()):
            names.append(DISABLE_DECODE_GRAPHS)
        for n in names:
            spec = flags.get(n)
            if spec is None:
                problems.append(f"param `{p.name}`: {n} is not a flag of {flags.source}")
            elif spec.deprecated:
                problems.append(f"param `{p.name}`: {n} is deprecated in {flags.source}")
        if s.flag and s.flag in flags.value_errors:
            problems.append(f"param `{p.name}`: " + "; ".join(flags.value_errors[s.flag]))
        for n in ([s.env] if s.env else []) + [x for x in s.see if not x.startswith("-")]:
            if not env_known(n):
                problems.append(f"param `{p.name}`: SGLang reads no variable {n}")
    return problems


def counterpart_checks(space: Space) -> list[tuple[str, list[Any]]]:
    """``(flag, values)`` for the parser to convert: every value a value-taking flag can receive from the space."""
    checks = []
    for p in space.params:
        s = p.server
        if s is None or not s.flag:
            continue
        vals: list[Any] = []
        for v in p.choices():
            args = flag_args(p, v, max_batch=max(space.objective.levels))
            if not args or args[0] != s.flag:
                continue
            if s.server_value(v) is True:  # a switch; with torch.compile, its batch limit too
                if len(args) > 2:
                    checks.append((args[1], [args[2]]))
                continue
            vals += args[1:]
        if vals:
            checks.append((s.flag, list(dict.fromkeys(vals))))
    return checks


@dataclass
class CodeChange:
    """A knob value of the twin's best that the exported command cannot give: ``instead`` is what the command runs
    (``None``: the knob drops out of the command, ``owner`` being the knob whose change removed it)."""

    param: str
    value: Any
    instead: Any
    why: str
    owner: str | None = None


@dataclass
class CommandConfig:
    """The twin's best configuration split in two: ``params``, the configuration the exported command runs (every
    value it cannot give replaced by what SGLang does instead), and ``changes``, what the best has beyond it."""

    params: dict[str, Any]
    changes: list[CodeChange] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line per code change, a knob that drops out with its owner indented under it."""
        out = []
        for c in self.changes:
            if c.owner is None:
                out.append(f"  {c.param}={c.value} (the command runs {c.param}={c.instead}): {c.why}")
                out += [f"    {d.param}={d.value}: {d.why}" for d in self.changes if d.owner == c.param]
        return out


def command_config(space: Space, params: dict[str, Any], arch: str | None = None) -> CommandConfig:
    """``params`` with every value the exported command cannot give on a GPU of architecture ``arch`` replaced by what
    SGLang runs instead (a value's ``not_deployable`` mark, or a flagless knob's ``deploys_as``); a conditional knob
    whose condition no longer holds drops out, listed under the knob that removed it."""
    out: dict[str, Any] = {}
    changes: list[CodeChange] = []
    for p in space.params:
        if p.name not in params:
            continue
        if p.when is not None and not p.when.holds(out):
            owner = next((n for n in p.when.names if out.get(n) != params.get(n)), p.when.names[0])
            changes.append(
                CodeChange(
                    p.name,
                    params[p.name],
                    None,
                    f"a knob of {owner}={params.get(owner)}, which the command does not run",
                    owner,
                )
            )
            continue
        value = params[p.name]
        mark = p.server.blocker(value, arch) if p.server else None
        if mark is not None:
            changes.append(CodeChange(p.name, value, mark.instead, mark.describe()))
            value = mark.instead
        out[p.name] = value
    return CommandConfig(out, changes)
