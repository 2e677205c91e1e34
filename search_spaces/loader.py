"""Load a YAML search space into a validated :class:`Space`.

Format (see ``dsv4_flash.yaml`` for a full example)::

    name: dsv4-flash
    target: workload
    preset: dsv4-flash
    settings: {live_context: 512}
    objective: {metric: tok_s, combine: geomean, levels: [1, 16, 64]}
    params:
      context_length:
        type: categorical
        values: [8192, 131072, 1048576]
        default: 1048576
        flag: --context-length            # or kernel: sparse_decode.num_splits, env: NAME; none = workload knob
        when: {attention_impl: [mma]}     # optional condition
        requires: [cuda]                  # capabilities the whole parameter needs
        value_requires: {fp8: [fp8]}      # capabilities single values need
    constraints:
      - name: simt-has-no-split
        if: {attention_impl: [simt]}
        then: {num_splits: [1]}

A space can extend another (``extends: dsv4_flash``: a built-in name, or a file relative to the extending one) and
state only what differs (:func:`merge_spaces` has the rules); ``dsv4_flash_tiny.yaml`` extends ``dsv4_flash.yaml``.
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Any

import yaml

from search_spaces.buckets import DENSITIES
from search_spaces.deployment import load_deployment
from search_spaces.schema import (
    COMBINES,
    DEPLOY_KINDS,
    GOODPUT_METRICS,
    PARAM_TYPES,
    PARETO_METRICS,
    SLO_LEVEL,
    SLO_METRICS,
    Condition,
    Constraint,
    LevelConstraint,
    NotDeployable,
    Objective,
    Param,
    ServerCounterpart,
    Space,
    SpaceError,
    _fail,
    check_bucket_values,
    check_requirements,
)
from search_spaces.targets import TARGET_NAMES

_TOP_KEYS = {
    "name",
    "description",
    "target",
    "preset",
    "settings",
    "objective",
    "params",
    "constraints",
    "extends",
    "deployment",
}
_UNSET = (
    "unset"  # in an extending space's param: the parent's keys it drops (``unset: [description, server.deploys_as]``)
)
_PARAM_KEYS = {
    "type",
    "values",
    "low",
    "high",
    "step",
    "log",
    "default",
    "description",
    "flag",
    "kernel",
    "env",
    "when",
    "requires",
    "value_requires",
    "max_bs",
    "densities",
    "server",
}
_SERVER_KEYS = {"flag", "env", "none", "values", "note", "see", "not_deployable", "deploys_as"}
_NOT_DEPLOYABLE_KEYS = {"kind", "why", "source", "instead", "except_on", "only_on"}
_OBJECTIVE_KEYS = {"metric", "direction", "combine", "levels", "level", "unit", "constraints", "slo", "pareto"}

BUILTIN_DIR = Path(__file__).resolve().parent


def builtin_space_path(name: str) -> Path:
    """The path of a space shipped with the package (``dsv4_flash`` or ``dsv4_flash.yaml``)."""
    stem = name[:-5] if name.endswith(".yaml") else name
    return BUILTIN_DIR / f"{stem.replace('-', '_')}.yaml"


def load_space(path: str | Path) -> Space:
    """Read and validate a YAML space; a name without a path (``dsv4_flash``) means a built-in one."""
    p = Path(path)
    if not p.exists() and p.parent == Path(".") and builtin_space_path(str(path)).exists():
        p = builtin_space_path(str(path))
    try:
        text = p.read_text()
    except FileNotFoundError:
        builtins = sorted(x.stem for x in BUILTIN_DIR.glob("*.yaml"))
        raise SpaceError(f"{path}: space file not found; give a YAML file or a built-in name {builtins}") from None
    except OSError as exc:
        raise SpaceError(f"{path}: cannot read the space file ({exc.strerror}); check the path") from None
    return load_space_text(text, source=str(p))


def space_text(path: str | Path) -> str:
    """The text a study stores for the space at ``path`` (a file or a built-in name): the file as written, or, for a
    space that extends another, the resolved space as YAML, so the stored copy stands alone."""
    p = Path(path)
    if not p.exists() and builtin_space_path(str(path)).exists():
        p = builtin_space_path(str(path))
    text = p.read_text()
    data = _parse(text, str(p))
    if not (isinstance(data, dict) and "extends" in data):
        return text
    resolved = _resolve_extends(data, str(p), (str(p.resolve()),))
    return f"# {p.name} resolved (it extends {data['extends']})\n" + yaml.safe_dump(
        resolved, sort_keys=False, width=120, allow_unicode=True, default_flow_style=None
    )


def _parse(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpaceError(f"{source}: broken YAML{at}: {problem}; fix the syntax there") from None


def _parent_path(name: Any, source: str) -> Path:
    """Where ``extends: name`` points from the space at ``source``: a file beside it, else a built-in space."""
    if not isinstance(name, str) or not name:
        raise _fail(
            source,
            "`extends` must name a space",
            name,
            "write `extends: dsv4_flash` (a built-in name or a file beside this one)",
        )
    here = Path(source).parent if source and not source.startswith("<") else Path(".")
    for candidate in (here / name, here / f"{name}.yaml", builtin_space_path(name)):
        if candidate.is_file():
            return candidate
    builtins = sorted(x.stem for x in BUILTIN_DIR.glob("*.yaml"))
    raise _fail(source, "`extends` names no space", name, f"give a file beside this one or a built-in name {builtins}")


def _resolve_extends(data: dict, source: str, chain: tuple[str, ...]) -> dict:
    """``data`` with its ``extends`` (and the parent's, in turn) merged in; a space extending itself, directly or
    not, is an error."""
    if "extends" not in data:
        return data
    parent_path = _parent_path(data["extends"], source)
    key = str(parent_path.resolve())
    if key in chain:
        raise _fail(source, "`extends` goes round in a circle", " -> ".join([*chain, key]), "remove one `extends`")
    parent = _parse(parent_path.read_text(), str(parent_path))
    if not isinstance(parent, dict):
        raise _fail(
            str(parent_path),
            "a space must be a YAML mapping",
            type(parent).__name__,
            "start with `name:` and `params:`",
        )
    return merge_spaces(_resolve_extends(parent, str(parent_path), (*chain, key)), data, source)


def _deep_merge(base: Any, over: Any) -> Any:
    """Mappings merged key by key (recursively); anything else (lists, scalars) replaced by ``over``."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _deep_merge(base[k], v) if k in base else v
        return out
    return over


def _drop(where: str, pdef: dict, dotted: Any) -> None:
    """Remove ``server.deploys_as``-style dotted keys from a merged param (``unset``)."""
    if not isinstance(dotted, str) or not dotted:
        raise _fail(where, "`unset` must list keys of the parent's param", dotted, "write `unset: [description]`")
    *path, last = dotted.split(".")
    node: Any = pdef
    for k in path:
        node = node.get(k) if isinstance(node, dict) else None
    if not isinstance(node, dict) or last not in node:
        raise _fail(
            where,
            "`unset` names a key the parent's param does not have",
            dotted,
            "list only keys the extended space sets",
        )
    del node[last]


def merge_spaces(parent: dict, child: dict, source: str) -> dict:
    """The space ``child`` (which has ``extends``) makes of ``parent``, as a YAML mapping:

    - top-level keys: the child's replace the parent's, except ``settings`` (merged key by key);
    - ``params``: in the parent's order; a param the child names is merged into the parent's (mappings key by key,
      lists and scalars replaced; ``unset: [key, server.key]`` drops the parent's keys), and ``name: null`` removes
      it; a param the parent does not have is placed after the child's entry before it (first if none);
    - ``constraints``: the parent's, each replaced by the child's of the same name; the child's others appended;
      a constraint that names a removed param goes with it."""
    where = f"{source}: extends {child['extends']}"
    out = {k: v for k, v in parent.items() if k != "extends"}
    for key, value in child.items():
        if key in ("extends", "params", "constraints"):
            continue
        out[key] = _deep_merge(parent.get(key), value) if key == "settings" else value
    params = dict(parent.get("params") or {})
    order = list(params)
    removed: set[str] = set()
    at = -1  # where the child's previous entry sits in ``order``
    for name, pdef in (child.get("params") or {}).items():
        if pdef is None:
            if name not in params:
                raise _fail(
                    where,
                    "`params` removes a param the extended space does not have",
                    name,
                    "remove only the parent's params",
                )
            at = order.index(name) - 1
            order.remove(name)
            del params[name]
            removed.add(name)
            continue
        if not isinstance(pdef, dict):
            raise _fail(f"{where}: param `{name}`", "a param must be a mapping", pdef, "write `name: {values: [...]}`")
        if name in params:
            merged = _deep_merge(params[name], {k: v for k, v in pdef.items() if k != _UNSET})
            for dotted in pdef.get(_UNSET) or ():
                _drop(f"{where}: param `{name}`", merged, dotted)
            params[name] = merged
            at = order.index(name)
        else:
            if _UNSET in pdef:
                raise _fail(
                    f"{where}: param `{name}`",
                    "`unset` in a param the extended space does not have",
                    pdef[_UNSET],
                    f"drop `unset` from `{name}`",
                )
            params[name] = pdef
            at += 1
            order.insert(at, name)
    out["params"] = {n: params[n] for n in order}
    mine = {c.get("name"): c for c in child.get("constraints") or [] if isinstance(c, dict)}
    constraints = []
    for c in parent.get("constraints") or []:
        c = mine.pop(c.get("name"), c) if isinstance(c, dict) else c
        names = set((c.get("if") or {}) | (c.get("then") or {})) if isinstance(c, dict) else set()
        if not names & removed:
            constraints.append(c)
    constraints += list(mine.values())
    if constraints or "constraints" in parent:
        out["constraints"] = constraints
    return out


def load_space_text(text: str, *, source: str = "<string>") -> Space:
    data = _parse(text, source)
    if not isinstance(data, dict):
        raise _fail(source, "a space must be a YAML mapping", type(data).__name__, "start with `name:` and `params:`")
    _unknown(source, data, _TOP_KEYS, "top-level key")
    if "extends" in data:
        data = _resolve_extends(data, source, (str(Path(source).resolve()),) if not source.startswith("<") else ())
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(source, "`name` must be a non-empty string", name, "add `name: my-space`")
    target = data.get("target", "workload")
    if target not in TARGET_NAMES and not (isinstance(target, str) and ":" in target):
        raise _fail(source, "unknown `target`", target, f"use one of {TARGET_NAMES} or a plug-in module.path:ClassName")
    raw_params = data.get("params")
    if not isinstance(raw_params, dict) or not raw_params:
        raise _fail(
            source,
            "`params` must be a non-empty mapping of parameter name to definition",
            raw_params,
            "add at least one parameter under `params:`",
        )
    params: list[Param] = []
    for pname, pdef in raw_params.items():
        params.append(_param(source, str(pname), pdef))
    names = {p.name for p in params}
    for p in params:
        if p.when is not None:
            _check_clauses(f"{source}: param `{p.name}` when", p.when.clauses, params, names)
    seen: set[str] = set()
    for p in params:  # a condition may only look at parameters declared before it (define-by-run order)
        if p.when is not None:
            for n in p.when.names:
                if n not in seen:
                    raise _fail(
                        f"{source}: param `{p.name}`",
                        "`when` refers to a parameter declared after it",
                        n,
                        f"move `{n}` above `{p.name}`",
                    )
        seen.add(p.name)
    constraints = tuple(_constraint(source, i, c, params, names) for i, c in enumerate(data.get("constraints") or []))
    settings = data.get("settings") or {}
    if not isinstance(settings, dict):
        raise _fail(source, "`settings` must be a mapping", settings, "write `settings: {live_context: 512}`")
    space = Space(
        name=name,
        params=tuple(params),
        constraints=constraints,
        objective=_objective(source, data.get("objective") or {}),
        target=target,
        preset=str(data.get("preset", "dsv4-flash")),
        description=str(data.get("description", "")),
        source=source,
        settings=dict(settings),
        deployment=_deployment(source, data.get("deployment"), params),
    )
    bad = space.violated_constraints(space.defaults())
    if bad:
        raise _fail(
            source,
            f"the defaults violate constraint `{bad[0].name}`",
            space.defaults(),
            "change the defaults or the constraint so the baseline is valid",
        )
    return space


def _deployment(source: str, name: Any, params: list[Param]):
    """The space's deployment map, each ``twin`` value checked against the space's parameters."""
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise _fail(
            source,
            "`deployment` must name a map in search_spaces/deployments/",
            name,
            "write `deployment: sglang-0.5.23-dsv4`",
        )
    dep = load_deployment(name, f"{source}: deployment")
    by_name = {p.name: p for p in params}
    for run in dep.runs:
        for knob, value in (run.twin or {}).items():
            where = f"{source}: deployment {name} ({run.component}, {run.source})"
            if knob not in by_name:
                raise _fail(where, "names a knob the space does not have", knob, f"use one of {sorted(by_name)}")
            if value not in by_name[knob].choices():
                raise _fail(
                    where, f"names a value `{knob}` does not have", value, f"use one of {list(by_name[knob].choices())}"
                )
    return dep


def _unknown(where: str, data: dict, allowed: set[str], what: str) -> None:
    for key in data:
        if key not in allowed:
            raise _fail(where, f"unknown {what} `{key}`", key, f"use one of {sorted(allowed)}")


def _param(source: str, name: str, pdef: Any) -> Param:
    where = f"{source}: param `{name}`"
    if not isinstance(pdef, dict):
        raise _fail(where, "a parameter must be a mapping", pdef, "give at least `type:` and `default:`")
    _unknown(where, pdef, _PARAM_KEYS, "key")
    ptype = pdef.get("type")
    if ptype not in PARAM_TYPES:
        raise _fail(where, "unknown type", ptype, f"use one of {PARAM_TYPES}")
    if "default" not in pdef:
        raise _fail(where, "missing `default`", None, "add `default:` (the baseline value)")
    kw: dict[str, Any] = {
        "name": name,
        "type": ptype,
        "default": pdef["default"],
        "description": str(pdef.get("description", "")),
        "flag": pdef.get("flag"),
        "kernel": pdef.get("kernel"),
        "env": pdef.get("env"),
        "log": bool(pdef.get("log", False)),
    }
    dests = [k for k in ("flag", "kernel", "env") if pdef.get(k)]
    if len(dests) > 1:
        raise _fail(where, "a parameter goes to one place only", dests, "keep one of `flag`, `kernel`, `env`")
    if kw["flag"] is not None and not (isinstance(kw["flag"], str) and kw["flag"].startswith("-")):
        raise _fail(where, "`flag` must be an option name starting with '-'", kw["flag"], "write e.g. --context-length")
    if ptype == "categorical":
        values = pdef.get("values")
        if not isinstance(values, list) or not values:
            raise _fail(where, "a categorical needs a non-empty `values` list", values, "add `values: [a, b]`")
        if len(set(map(repr, values))) != len(values):
            raise _fail(where, "duplicate values", values, "list each value once")
        for v in values:
            if not isinstance(v, (str, int, float, bool)) or v is None:
                raise _fail(where, "values must be strings, numbers or booleans", v, "quote it as a string")
        kw["values"] = tuple(values)
    elif ptype == "buckets":
        max_bs, densities = pdef.get("max_bs"), pdef.get("densities", list(DENSITIES[:3]))
        if not isinstance(max_bs, list) or not max_bs or not all(isinstance(b, int) and b >= 1 for b in max_bs):
            raise _fail(
                where, "a bucket set needs `max_bs`, a list of positive integers", max_bs, "add `max_bs: [16, 64, 256]`"
            )
        if not isinstance(densities, list) or not all(d in DENSITIES for d in densities):
            raise _fail(where, "bad `densities`", densities, f"use values from {DENSITIES}")
        values = [f"{d}:{b}" for d in densities for b in max_bs if d != "none"]
        if "none" in densities:
            values.append("none:1")
        kw["values"] = tuple(values)
        if isinstance(kw["default"], dict):
            kw["default"] = f"{kw['default'].get('density')}:{kw['default'].get('max_bs')}"
        check_bucket_values(where, kw["values"])
    elif ptype in ("int", "pow2", "float"):
        low, high = pdef.get("low"), pdef.get("high")
        numeric = (int,) if ptype != "float" else (int, float)
        if not isinstance(low, numeric) or not isinstance(high, numeric) or isinstance(low, bool):
            raise _fail(where, f"a {ptype} needs numeric `low` and `high`", (low, high), "add `low:` and `high:`")
        if not low <= high:
            raise SpaceError(f"{where}: `low <= high` must hold, but got (low={low}, high={high}); swap them")
        if ptype == "pow2" and (low < 1 or low & (low - 1) or high & (high - 1)):
            raise _fail(where, "pow2 bounds must be powers of two", (low, high), "use e.g. low: 16, high: 256")
        if kw["log"] and low <= 0:
            raise _fail(where, "a log range needs low > 0", low, "raise `low` above zero or drop `log`")
        step = pdef.get("step")
        if step is not None and (not isinstance(step, (int, float)) or step <= 0):
            raise _fail(where, "`step` must be a positive number", step, "drop it or give e.g. `step: 8`")
        kw.update(low=low, high=high, step=step)
    elif ptype == "bool":
        if pdef.get("values") is not None:
            raise _fail(where, "a bool takes no `values`", pdef.get("values"), "drop `values`")
    if "server" in pdef:
        kw["server"] = _server(where, pdef["server"])
    if "when" in pdef:
        kw["when"] = Condition(_clauses(f"{where} when", pdef["when"]))
    if "requires" in pdef:
        kw["requires"] = check_requirements(where, pdef["requires"])
    vreq = pdef.get("value_requires") or {}
    if not isinstance(vreq, dict):
        raise _fail(where, "`value_requires` must map values to capability lists", vreq, "write `{fp8: [fp8]}`")
    kw["value_requires"] = {v: check_requirements(f"{where} value {v!r}", r) for v, r in vreq.items()}
    param = Param(**kw)
    for v in param.server.values if param.server else {}:
        if not param.contains(v):
            raise _fail(
                f"{where} server", "`values` names a value the parameter cannot take", v, f"use values of `{name}`"
            )
    for v, mark in param.server.not_deployable.items() if param.server else ():
        for what, x in (("`not_deployable` names", v), (f"`not_deployable.{v}.instead` is", mark.instead)):
            if not param.contains(x):
                raise _fail(
                    f"{where} server", f"{what} a value the parameter cannot take", x, f"use values of `{name}`"
                )
    for deployed in [param.server.deploys_as, *param.server.deploys_as_on.values()] if param.server else []:
        if deployed is not None and not param.contains(deployed):
            raise _fail(
                f"{where} server",
                "`deploys_as` is a value the parameter cannot take",
                deployed,
                f"use a value of `{name}`",
            )
    for v in param.value_requires:
        if not param.contains(v):
            raise _fail(where, "`value_requires` names a value the parameter cannot take", v, "fix the value")
    if ptype == "bool" and not isinstance(param.default, bool):
        raise _fail(where, "the default of a bool must be true or false", param.default, "write `default: false`")
    if not param.contains(param.default):
        raise _fail(
            where,
            "the default is not one of the parameter's values",
            param.default,
            "pick the default from `values` or inside [low, high]",
        )
    if ptype == "float" and isinstance(param.default, float) and math.isnan(param.default):
        raise _fail(where, "the default is NaN", param.default, "give a number")
    return param


def _server(where: str, raw: Any) -> ServerCounterpart:
    """``server: {flag: --x}``, ``{env: NAME}`` or ``{none: why}``, with optional ``values``, ``note``, ``see``."""
    where = f"{where} server"
    fix = "write `server: {flag: --context-length}`, `{env: SGLANG_NAME}` or `{none: why there is none}`"
    if not isinstance(raw, dict):
        raise _fail(where, "must be a mapping", raw, fix)
    _unknown(where, raw, _SERVER_KEYS, "key")
    kinds = [k for k in ("flag", "env", "none") if k in raw]
    if len(kinds) != 1:
        raise _fail(where, "needs exactly one of `flag`, `env`, `none`", kinds, fix)
    flag, env, none = raw.get("flag"), raw.get("env"), raw.get("none")
    if flag is not None and not (isinstance(flag, str) and flag.startswith("--")):
        raise _fail(where, "`flag` must be a long option name", flag, "write e.g. `flag: --context-length`")
    if env is not None and not (isinstance(env, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env)):
        raise _fail(where, "`env` must be an environment variable name", env, "write e.g. `env: SGLANG_MOE_CONFIG_DIR`")
    if "none" in raw and not (isinstance(none, str) and none.strip()):
        raise _fail(
            where,
            "`none` must say why there is no counterpart",
            none,
            "write `none: the twin's own Triton kernel; SGLang cannot load it`",
        )
    values = raw.get("values") or {}
    if not isinstance(values, dict) or "none" in raw and values:
        raise _fail(
            where,
            "`values` must map knob values to server values (and only with `flag` or `env`)",
            values,
            "write `values: {triton: true, torch: false}`",
        )
    for v in values.values():
        if v is not None and not isinstance(v, (str, int, float, bool)):
            raise _fail(where, "a server value must be a string, number, boolean or null", v, "quote it")
    see = raw.get("see") or []
    if isinstance(see, str):
        see = [see]
    if not isinstance(see, list) or not all(isinstance(x, str) and x for x in see):
        raise _fail(where, "`see` must be a list of flag or variable names", see, "write `see: [--fp8-gemm-backend]`")
    marks = raw.get("not_deployable") or {}
    if not isinstance(marks, dict):
        raise _fail(
            where,
            "`not_deployable` must map knob values to {kind, why, source, instead}",
            marks,
            "write `not_deployable: {triton: {kind: declined, why: ..., source: ..., instead: torch}}`",
        )
    if "deploys_as" in raw and "none" not in raw and not (flag and None in dict(values).values()):
        raise _fail(
            where,
            "`deploys_as` goes with `none`, or with a flag whose `values` leave it out for some knob values",
            raw["deploys_as"],
            "mark a flag's values with `not_deployable` instead",
        )
    return ServerCounterpart(
        flag=flag,
        env=env,
        none=str(none or "").strip(),
        values=dict(values),
        note=str(raw.get("note", "")),
        see=tuple(see),
        not_deployable={v: _not_deployable(f"{where} not_deployable {v!r}", m) for v, m in marks.items()},
        **_deploys_as(where, raw.get("deploys_as")),
    )


def _deploys_as(where: str, raw: Any) -> dict[str, Any]:
    """``deploys_as: fp8``, or per GPU architecture ``{sm_90: deepgemm, default: torch}``."""
    if not isinstance(raw, dict):
        return {"deploys_as": raw}
    if "default" not in raw:
        raise _fail(
            where,
            "a per-architecture `deploys_as` needs a `default`",
            raw,
            "write `deploys_as: {sm_90: deepgemm, default: torch}`",
        )
    return {"deploys_as": raw["default"], "deploys_as_on": {str(k): v for k, v in raw.items() if k != "default"}}


def _not_deployable(where: str, raw: Any) -> NotDeployable:
    fix = "write `{kind: declined, why: ..., source: sglang/..., instead: torch}`"
    if not isinstance(raw, dict):
        raise _fail(where, "must be a mapping", raw, fix)
    _unknown(where, raw, _NOT_DEPLOYABLE_KEYS, "key")
    if raw.get("kind") not in DEPLOY_KINDS:
        raise _fail(where, "`kind` must be one of " + ", ".join(DEPLOY_KINDS), raw.get("kind"), fix)
    for key in ("why", "source"):
        if not (isinstance(raw.get(key), str) and raw[key].strip()):
            raise _fail(where, f"`{key}` must be a non-empty text", raw.get(key), fix)
    if "instead" not in raw:
        raise _fail(where, "`instead` (the value SGLang runs in its place) is missing", None, fix)
    archs = {}
    for key in ("except_on", "only_on"):
        value = raw.get(key) or []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
            raise _fail(where, f"`{key}` must be a list of GPU architectures", value, "write `[gfx950]`")
        archs[key] = tuple(value)
    if archs["except_on"] and archs["only_on"]:
        raise _fail(where, "`except_on` and `only_on` exclude each other", archs, "keep one of them")
    return NotDeployable(
        kind=raw["kind"],
        why=" ".join(raw["why"].split()),
        source=raw["source"].strip(),
        instead=raw["instead"],
        **archs,
    )


def _clauses(where: str, raw: Any) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    if not isinstance(raw, dict) or not raw:
        raise _fail(where, "must map parameter names to lists of values", raw, "write `{attention_impl: [mma]}`")
    out = []
    for name, allowed in raw.items():
        if not isinstance(allowed, list):
            allowed = [allowed]
        out.append((str(name), tuple(allowed)))
    return tuple(out)


def _check_clauses(where: str, clauses, params: list[Param], names: set[str]) -> None:
    by_name = {p.name: p for p in params}
    for name, allowed in clauses:
        if name not in names:
            raise _fail(where, "refers to an unknown parameter", name, f"use one of {sorted(names)}")
        for v in allowed:
            if not by_name[name].contains(v):
                raise _fail(where, f"value is not one of `{name}`'s values", v, "fix the value")


def _constraint(source: str, i: int, raw: Any, params: list[Param], names: set[str]) -> Constraint:
    where = f"{source}: constraint #{i + 1}"
    if not isinstance(raw, dict):
        raise _fail(where, "a constraint must be a mapping", raw, "give `name`, `if` and `then`")
    _unknown(where, raw, {"name", "if", "then", "message"}, "key")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(where, "a constraint needs a `name`", name, "add `name: my-rule`")
    where = f"{source}: constraint `{name}`"
    when = _clauses(f"{where} if", raw.get("if"))
    then = _clauses(f"{where} then", raw.get("then"))
    _check_clauses(f"{where} if", when, params, names)
    _check_clauses(f"{where} then", then, params, names)
    return Constraint(name=name, when=Condition(when), then=then, message=str(raw.get("message", "")))


def _objective(source: str, raw: Any) -> Objective:
    where = f"{source}: objective"
    if not isinstance(raw, dict):
        raise _fail(where, "must be a mapping", raw, "write `objective: {metric: tok_s}`")
    _unknown(where, raw, _OBJECTIVE_KEYS, "key")
    combine = raw.get("combine", "geomean")
    if combine not in COMBINES:
        raise _fail(where, "unknown `combine`", combine, f"use one of {COMBINES}")
    direction = raw.get("direction", "maximize")
    if direction not in ("maximize", "minimize"):
        raise _fail(where, "unknown `direction`", direction, "use maximize or minimize")
    levels = raw.get("levels", [1, 16, 64])
    if not isinstance(levels, list) or not levels or not all(isinstance(c, int) and c >= 1 for c in levels):
        raise _fail(where, "`levels` must be a list of positive integers", levels, "write `levels: [1, 16, 64]`")
    level = raw.get("level")
    if combine == "level" and level not in levels:
        raise _fail(where, "`combine: level` needs `level` to be one of `levels`", level, f"pick one of {levels}")
    cons = []
    for c in raw.get("constraints") or []:
        if not isinstance(c, dict) or "metric" not in c or not ({"min", "max"} & set(c)):
            raise _fail(
                where,
                "a level constraint needs `metric`, `level` and `min` or `max`",
                c,
                "write `{metric: tok_s, level: 1, min: 20}`",
            )
        lvl = c.get("level", "")
        cons.append(
            LevelConstraint(
                metric=str(c["metric"]),
                level=f"c={lvl}" if isinstance(lvl, int) else str(lvl),
                min=c.get("min"),
                max=c.get("max"),
            )
        )
    metric = str(raw.get("metric", "tok_s"))
    slo = _slo(where, metric, raw.get("slo"))
    cons += [LevelConstraint(metric=k, level=SLO_LEVEL, max=v) for k, v in slo]
    unit = raw.get("unit") or ("req/s" if metric.startswith("goodput_req") else "tok/s")
    if metric in GOODPUT_METRICS and direction != "maximize":
        raise _fail(
            where,
            f"`{metric}` is the most load served within the SLO: `direction` must be maximize",
            direction,
            "drop `direction` or write `direction: maximize`",
        )
    pareto = raw.get("pareto")
    if pareto is not None and (pareto not in PARETO_METRICS or metric not in GOODPUT_METRICS):
        raise _fail(
            where,
            "`pareto` names the second objective beside a goodput metric",
            pareto,
            f"write `pareto: {PARETO_METRICS[0]}` with `metric:` one of {list(GOODPUT_METRICS)}",
        )
    return Objective(
        metric=metric,
        direction=direction,
        combine=combine,
        levels=tuple(levels),
        level=level,
        unit=str(unit),
        constraints=tuple(cons),
        slo=slo,
        pareto=pareto,
    )


def _slo(where: str, metric: str, raw: Any) -> tuple[tuple[str, float], ...]:
    """``slo: {ttft_ms_p99: 500, tpot_ms_p95: 50}``: the limits of a goodput objective, checked one by one."""
    if raw is None:
        if metric in GOODPUT_METRICS:
            raise _fail(
                where, f"`{metric}` needs an `slo`", raw, "write e.g. `slo: {ttft_ms_p99: 500, tpot_ms_p95: 50}`"
            )
        return ()
    if metric not in GOODPUT_METRICS:
        raise _fail(
            where,
            f"`slo` is the limit of a goodput objective, not of `{metric}`",
            raw,
            f"use `metric:` one of {list(GOODPUT_METRICS)}, or limits as `constraints`",
        )
    if not isinstance(raw, dict) or not raw:
        raise _fail(where, "`slo` must map latency metrics to limits", raw, "write `slo: {ttft_ms_p99: 500}`")
    out = []
    for key, limit in raw.items():
        if key not in SLO_METRICS:
            close = difflib.get_close_matches(str(key), SLO_METRICS, n=1)
            raise _fail(
                f"{where} slo",
                "unknown latency metric",
                key,
                f"did you mean `{close[0]}`?" if close else f"use one of {list(SLO_METRICS)}",
            )
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
            raise _fail(
                f"{where} slo `{key}`",
                "a limit must be a positive number of milliseconds",
                limit,
                f"write e.g. `{key}: 500`",
            )
        out.append((str(key), float(limit)))
    return tuple(out)
