"""A server's own command-line flags: read from its argparse parser, checked, renamed, and ruled on.

- :func:`introspect_parser` runs ``_introspect.py`` with the server's Python to dump the parser (option names,
  aliases, choices, types, deprecations) and to convert candidate values with the parser's own ``type``.
- :func:`parse_help_text` is the fallback for any server: the ``--help`` text of an argparse, click or typer
  program (boolean pairs ``--x / --no-x``, choice lists ``{a,b}``, ``[a|b]``, ``<a|b>``).
- :class:`ServerFlags` answers "is this flag accepted, and if not, what is the closest valid name".
- :func:`params_to_args` turns a trial's params into flag arguments and environment variables (one place).
- :data:`RULES` is the table of known incompatible combinations; each rule has a name and is logged when it fires.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search_spaces import Param, expand_buckets
from tuner.errors import FlagsUnavailable

_logger = logging.getLogger(__name__)

SGLANG_PARSER = "sglang.srt.server_args:ServerArgs.add_cli_args"
INTROSPECT_SCRIPT = Path(__file__).with_name("_introspect.py")

SERVER_DEFAULT = "server_default"
"""A categorical value meaning "leave the flag out" (the server picks its own default)."""

KNOWN_RENAMES = {
    # SGLang 0.5.12 -> 0.5.23 (DESIGN.md); used before difflib when the new name exists in the build.
    "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
    "--cuda-graph-bs": "--cuda-graph-bs-decode",
    "--nsa-decode-backend": "--dsa-decode-backend",
    "--nsa-prefill-backend": "--dsa-prefill-backend",
    "--disable-cuda-graph": "--cuda-graph-backend-decode disabled",
    "--enable-dp-attention": "--attn-dp-size",
}

SPACE_RELEASE = "0.5.23"
"""The SGLang release the spaces' flags are written for (and checked against where none is installed)."""
RELEASE_RENAMES: dict[str, dict[str, str]] = {
    # per older release: a 0.5.23 flag -> the name that release knows (DESIGN.md; 0.5.12's own --help)
    "0.5.12": {
        "--cuda-graph-bs-decode": "--cuda-graph-bs",
        "--cuda-graph-max-bs-decode": "--cuda-graph-max-bs",
        "--disable-decode-cuda-graph": "--disable-cuda-graph",
        "--dsa-decode-backend": "--nsa-decode-backend",
        "--dsa-prefill-backend": "--nsa-prefill-backend",
    },
}


def name_in_release(flag: str, flags: ServerFlags) -> str | None:
    """``flag`` (a 0.5.23 name) as the parser ``flags`` knows it: itself, or its name in an older release's rename
    table (:data:`RELEASE_RENAMES`) when that name is the one this parser has; ``None`` when it has neither."""
    if flag in flags and not (flags.get(flag).removed):
        return flag
    for table in RELEASE_RENAMES.values():
        old = table.get(flag)
        if old and old in flags:
            return old
    return None


@dataclass(frozen=True)
class FlagSpec:
    names: tuple[str, ...]
    takes_value: bool = True
    nargs: Any = None
    choices: tuple[str, ...] | None = None
    type: str | None = None
    default: Any = None
    help: str = ""
    deprecated: bool = False
    removed: bool = False
    new_flag: str | None = None

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def is_list(self) -> bool:
        return self.nargs in ("+", "*") or isinstance(self.nargs, int) and self.nargs > 1


@dataclass
class ServerFlags:
    """The options one server build accepts. ``source`` says where they were read from."""

    options: list[FlagSpec]
    source: str = ""
    version: str | None = None
    value_errors: dict[str, list[str]] = field(default_factory=dict)
    """Per flag: candidate values the parser's own type/choices refused (filled by :func:`introspect_parser`)."""

    def __post_init__(self) -> None:
        self._by_name = {n: o for o in self.options for n in o.names}

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def get(self, name: str) -> FlagSpec | None:
        return self._by_name.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def suggest(self, name: str) -> str | None:
        """The closest accepted name: a known rename first, then difflib; ``None`` when nothing is close."""
        renamed = KNOWN_RENAMES.get(name)
        if renamed and renamed.split()[0] in self:
            return renamed
        close = difflib.get_close_matches(name, self.names, n=1, cutoff=0.6)
        return close[0] if close else None

    def check_value(self, name: str, value: Any) -> str | None:
        """A reason when ``value`` is refused by the flag's choices (type checks come from the parser itself)."""
        spec = self.get(name)
        if spec is None or spec.choices is None:
            return None
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if _text(v) not in spec.choices:
                hint = ""
                if isinstance(v, bool) and {"on", "off", "yes", "no"} & set(spec.choices):
                    hint = '; YAML reads an unquoted on/off/yes/no as a boolean: quote it ("on")'
                return f"{_text(v)!r} is not one of the choices of {name}: {sorted(spec.choices)}{hint}"
        return None


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def introspect_parser(
    python: str = sys.executable,
    parser: str = SGLANG_PARSER,
    checks: Sequence[tuple[str, Sequence[Any]]] = (),
    timeout_s: float = 120.0,
) -> ServerFlags:
    """Read the parser ``module:callable`` (``callable(argparse.ArgumentParser())`` adds the options) with
    ``python`` and convert every candidate value in ``checks`` with the option's own type and choices."""
    payload = json.dumps([[f, [_text(v) for v in vals]] for f, vals in checks])
    try:
        done = subprocess.run(
            [python, str(INTROSPECT_SCRIPT), parser], input=payload, capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FlagsUnavailable(f"cannot run {python} to read the parser {parser}: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise FlagsUnavailable(f"reading the parser {parser} with {python} failed: {tail}")
    data = json.loads(done.stdout)
    options = [
        FlagSpec(
            names=tuple(o["names"]),
            takes_value=o["takes_value"],
            nargs=o["nargs"],
            choices=tuple(o["choices"]) if o["choices"] is not None else None,
            type=o["type"],
            default=o["default"],
            help=o["help"],
            deprecated=o["deprecated"],
            removed=o["removed"],
            new_flag=o["new_flag"],
        )
        for o in data["options"]
    ]
    errors = {c["flag"]: c["errors"] for c in data["checks"] if c["errors"]}
    return ServerFlags(
        options, source=f"argparse parser {parser} ({python})", version=data.get("version"), value_errors=errors
    )


_BOX = "│╭╰╮╯─┃"
_NAME = re.compile(r"-{1,2}[A-Za-z0-9?][\w.\-]*")
_WORD_METAVAR = re.compile(r"[A-Z][A-Z0-9_\-]*(\.\.\.)?|\.\.\.|\.\.\.\]")


def _tokens(column: str) -> list[str]:
    """Whitespace-separated tokens of one column, a bracketed group (``[a|b]``, ``{a,b}``, ``<int>``,
    ``[X ...]``) kept whole."""
    out, depth, cur = [], 0, ""
    for ch in column:
        if ch in "[{<":
            depth += 1
        elif ch in "]}>" and depth:
            depth -= 1
        if ch.isspace() and depth == 0:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


def _is_name(tok: str) -> bool:
    return bool(_NAME.fullmatch(tok.rstrip(",").split("=", 1)[0]))


_BRACKET_METAVAR = re.compile(r"\{[^}]*\}|<[^<>\s]+>|\[[^]\s|]+(\|[^]\s|]+)+\]|\[[A-Z][A-Z0-9_\-]*( \.\.\.)?\]")
"""``{a,b}``, ``<int>``, ``[on|off]``, ``[X ...]``, ``[TEXT]``; not ``[default: 8]`` or ``[required]`` (help)."""


def _is_metavar(tok: str) -> bool:
    t = tok.rstrip(",")
    return bool(_WORD_METAVAR.fullmatch(t) or _BRACKET_METAVAR.fullmatch(t))


def _choices(metavar: str) -> tuple[str, ...] | None:
    """``{a,b}`` (argparse), ``[a|b]`` (click), ``<a|b>`` (typer's rich help) -> ``("a", "b")``."""
    inner = metavar[1:-1]
    if metavar.startswith("{"):
        return tuple(inner.split(","))
    if metavar[:1] in "[<" and "|" in inner and " " not in inner:
        return tuple(inner.split("|"))
    return None


BOOL_METAVARS = ("BOOL", "BOOLEAN", "<boolean>", "{BOOL}")
"""A value placeholder of a flag taking a boolean value (``--x BOOL``)."""
BOOL_VALUES = ("true", "false", "1", "0", "yes", "no", "on", "off", "True", "False")
"""The spellings a boolean value flag accepts (what ``--help`` can check; the server may accept fewer)."""
_QUOTED_CHOICES = re.compile(r"\(\s*'([\w.-]+)'((?:\s*,\s*'[\w.-]+')*),?\s*or\s*'([\w.-]+)'")
"""Help text listing the values: ``('on', 'off', or 'auto', default: 'auto')`` (llama.cpp's server)."""


def _help_choices(metavars: Sequence[str], help_text: str) -> tuple[str, ...] | None:
    """The values a flag takes as its help says when no placeholder lists them: a boolean placeholder (``BOOL``),
    or quoted values joined by ``or`` in its help text."""
    if any(m.strip("[]") in BOOL_METAVARS for m in metavars):
        return BOOL_VALUES
    m = _QUOTED_CHOICES.search(help_text)
    if m:
        middle = re.findall(r"'([\w.-]+)'", m.group(2) or "")
        return (m.group(1), *middle, m.group(3))
    return None


@dataclass
class _Head:
    names: list[str] = field(default_factory=list)
    off_names: list[str] = field(default_factory=list)
    """Click's ``--x / --no-x``: the names after the slash (a switch of their own)."""
    metavars: list[str] = field(default_factory=list)
    help: str = ""


def _read_head(line: str) -> _Head | None:
    """The option names and value placeholders an option line starts with, or None when it is not one. Columns are
    separated by two or more spaces; the first column holding anything but names, ``/`` and placeholders is the
    help text."""
    columns = re.split(r"\s{2,}", line.strip())
    head = _Head()
    after_slash = False
    for n, column in enumerate(columns):
        toks = _tokens(column)
        if not toks or not all(_is_name(t) or _is_metavar(t) or t == "/" for t in toks):
            head.help = "  ".join(columns[n:])
            break
        for t in toks:
            if t == "/":
                after_slash = True
            elif _is_name(t):
                name, eq, meta = t.rstrip(",").partition("=")
                (head.off_names if after_slash else head.names).append(name)
                if eq:
                    head.metavars.append(meta)
            else:
                head.metavars.append(t.rstrip(","))
    return head if head.names else None


def parse_help_text(text: str, source: str = "--help") -> ServerFlags:
    """Options of a ``--help`` text, whatever wrote it: argparse (``--x X``, ``{a,b}``, ``[X ...]``), click
    (``--x / --no-x`` boolean pairs, ``[on|off|auto]`` choices, ``--x INTEGER``) or typer's boxed rich help
    (``--x  --no-x  <bool>``, ``<on|off>``, ``<int>``). Both halves of a boolean pair are switches; an option whose
    only placeholder is ``<bool>`` (typer) is a switch."""
    options: list[FlagSpec] = []
    lines = [ln.strip(_BOX).rstrip() for ln in text.splitlines()]
    for i, raw in enumerate(lines):
        stripped = raw.lstrip()
        indent = len(raw) - len(stripped)
        if stripped.startswith("* "):  # typer marks a required option with a star
            stripped = stripped[2:].lstrip()
        if not stripped.startswith("-") or indent > 8:
            continue
        head = _read_head(stripped)
        if head is None:
            continue
        help_text = head.help
        j = i + 1
        while (
            j < len(lines)
            and (len(lines[j]) - len(lines[j].lstrip())) > max(indent, 8)
            and not lines[j].lstrip().startswith("-")
        ):
            help_text += " " + lines[j].strip()
            j += 1
        if head.names[0] in ("-h", "--help") or "--help" in head.names:
            continue
        metavars = [m for m in head.metavars if m != "<bool>"]
        choices = next((c for m in metavars if (c := _choices(m))), None)
        takes = bool(metavars)
        if choices is None and takes:
            choices = _help_choices(metavars, help_text)
        list_ = any("..." in m for m in metavars)
        # a click/typer pair printed without a slash (typer's rich help): --x  --no-x
        names = [n for n in head.names if not (n.startswith("--no-") and f"--{n[5:]}" in head.names)]
        off = head.off_names + [n for n in head.names if n not in names]
        deprecated = help_text.lower().startswith("deprecated") or "[deprecated]" in help_text.lower()
        options.append(
            FlagSpec(
                names=tuple(names),
                takes_value=takes and not off,
                nargs="+" if list_ else (None if takes else 0),
                choices=choices,
                help=help_text[:400],
                deprecated=deprecated,
            )
        )
        if off:
            options.append(
                FlagSpec(
                    names=tuple(off), takes_value=False, nargs=0, help=f"turns {names[0]} off", deprecated=deprecated
                )
            )
    return ServerFlags(options, source=source)


def help_flags(argv: Sequence[str], timeout_s: float = 60.0, env: dict[str, str] | None = None) -> ServerFlags:
    """Run ``argv`` (ending in ``--help``) and parse its output; :class:`FlagsUnavailable` when it gives nothing."""
    # a wide terminal: click and typer's rich help fold option names at 80 columns
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FlagsUnavailable(f"cannot run {argv[0]!r} --help: {exc}") from None
    flags = parse_help_text(done.stdout + "\n" + done.stderr, source=f"`{' '.join(argv)}` output")
    if not flags.options:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise FlagsUnavailable(f"`{' '.join(argv)}` printed no options (exit {done.returncode}): {tail}")
    return flags


# -- params -> argv ---------------------------------------------------------------------------------------------


def param_flag_values(p: Param, value: Any) -> list[str] | None:
    """The argument strings after ``p.flag`` for ``value``: ``[]`` for a bare switch, ``None`` to leave it out."""
    if p.type == "bool":
        return [] if value else None
    if value == SERVER_DEFAULT or value is None:
        return None
    if p.type == "buckets":
        sizes = expand_buckets(value)
        return [str(b) for b in sizes] if sizes else None
    if p.type == "float":
        return [repr(float(value))]
    return [_text(value)]


def params_to_args(params_defs: Iterable[Param], params: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """Flag arguments and environment variables for ``params`` (inactive params, absent from it, are skipped)."""
    args: list[str] = []
    env: dict[str, str] = {}
    for p in params_defs:
        if p.name not in params:
            continue
        value = params[p.name]
        if p.flag:
            vals = param_flag_values(p, value)
            if vals is None:
                if p.type == "buckets" and value != SERVER_DEFAULT:  # density "none": no graphs
                    args.append("--disable-decode-cuda-graph")
                continue
            args += [p.flag, *vals]
        elif p.env:
            env[p.env] = ("1" if value else "0") if isinstance(value, bool) else _text(value)
    return args, env


def args_to_dict(args: Sequence[str]) -> dict[str, list[str]]:
    """``["--a", "1", "--b", "--c", "1", "2"]`` -> ``{"--a": ["1"], "--b": [], "--c": ["1", "2"]}``."""
    out: dict[str, list[str]] = {}
    current = None
    for a in args:
        if a.startswith("--") or (a.startswith("-") and len(a) == 2 and not a[1].isdigit()):
            name, eq, val = a.partition("=")
            current = name
            out[current] = [val] if eq else []
        elif current is not None:
            out[current].append(a)
    return out


def candidate_values(p: Param) -> list[Any]:
    """Values worth checking against the parser: every discrete value (ranges: the ends and the default)."""
    if p.type == "bool":
        return []
    if p.type == "buckets":
        sizes = sorted({b for v in p.values for b in expand_buckets(v)})
        return [str(b) for b in sizes]
    if p.type in ("int", "float") and p.low is not None:
        return [v for v in dict.fromkeys([p.low, p.high, p.default]) if v is not None]
    return [v for v in p.choices() if v != SERVER_DEFAULT]


# -- incompatibility rules --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A named incompatibility. ``check(flags, ctx)`` returns a message when it fires; ``refuse`` makes the trial
    ``invalid_config`` without a launch, otherwise the message is only logged as a warning."""

    name: str
    description: str
    check: Callable[[dict[str, list[str]], dict[str, Any]], str | None]
    refuse: bool = True
    flags: tuple[str, ...] = ()


def _int(vals: list[str] | None) -> int | None:
    try:
        return int(vals[0]) if vals else None
    except ValueError:
        return None


def _graph_max_bs(f: dict[str, list[str]]) -> int | None:
    for name in ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs"):
        if name in f:
            return _int(f[name])
    for name in ("--cuda-graph-bs-decode", "--cuda-graph-bs"):
        if name in f and f[name]:
            try:
                return max(int(v) for v in f[name])
            except ValueError:
                return None
    return None


def _torch_compile_unsupported(f, ctx):
    if "--enable-torch-compile" not in f:
        return None
    server: ServerFlags | None = ctx.get("server_flags")
    if server is not None and "--enable-torch-compile" not in server:
        return "--enable-torch-compile is not accepted by this server build"
    if ctx.get("torch_compile_supported") is False:
        return "torch.compile is not supported by this build/model (settings torch_compile_supported: false)"
    return None


def _compile_bs_above_graph_bs(f, ctx):
    if "--enable-torch-compile" not in f:
        return None
    compile_bs = _int(f.get("--torch-compile-max-bs")) or 32
    graph_bs = _graph_max_bs(f)
    if graph_bs is not None and compile_bs > graph_bs:
        return (
            f"--torch-compile-max-bs {compile_bs} is above the CUDA graph max batch size {graph_bs}: "
            "compiled sizes above it are never captured"
        )
    return None


def _dp_attention_deprecated(f, ctx):
    if "--enable-dp-attention" in f:
        return "--enable-dp-attention is deprecated; use --attn-dp-size <dp-size> instead"
    return None


def _buckets_above_max_bs(f, ctx):
    max_bs = _int(f.get("--cuda-graph-max-bs-decode"))
    sizes = f.get("--cuda-graph-bs-decode")
    if max_bs is None or not sizes:
        return None
    over = [s for s in sizes if s.isdigit() and int(s) > max_bs]
    if over:
        return f"--cuda-graph-bs-decode has sizes {over} above --cuda-graph-max-bs-decode {max_bs}"
    return None


def _graphs_disabled_with_buckets(f, ctx):
    off = (
        "--disable-cuda-graph" in f
        or "--disable-decode-cuda-graph" in f
        or f.get("--cuda-graph-backend-decode") == ["disabled"]
    )
    if off and ("--cuda-graph-bs-decode" in f or "--cuda-graph-max-bs-decode" in f):
        return "decode CUDA graphs are disabled, so the decode bucket flags have no effect"
    return None


def _graph_bs_above_running(f, ctx):
    running = _int(f.get("--max-running-requests"))
    graph_bs = _graph_max_bs(f)
    if running is not None and graph_bs is not None and graph_bs > running:
        return (
            f"CUDA graph max batch size {graph_bs} is above --max-running-requests {running}: "
            "the larger graphs are captured (memory, start-up time) but never replayed"
        )
    return None


def _tp_above_gpus(f, ctx):
    tp = _int(f.get("--tp-size") or f.get("--tensor-parallel-size"))
    gpus = ctx.get("gpu_count")
    if tp is not None and gpus is not None and gpus > 0 and tp > gpus:
        return f"--tp-size {tp} needs {tp} GPUs, this machine has {gpus}"
    return None


def _split_tile_with_splits(f, ctx):
    if "--triton-attention-split-tile-size" in f and "--triton-attention-num-kv-splits" in f:
        return (
            "--triton-attention-split-tile-size fixes the split by tile size (deterministic mode); "
            "--triton-attention-num-kv-splits is then ignored"
        )
    return None


RULES: tuple[Rule, ...] = (
    Rule(
        "torch-compile-unsupported",
        "torch.compile enabled with a build or model that rejects it",
        _torch_compile_unsupported,
        refuse=True,
        flags=("--enable-torch-compile",),
    ),
    Rule(
        "torch-compile-bs-above-cuda-graph-bs",
        "--torch-compile-max-bs above the CUDA graph max batch size",
        _compile_bs_above_graph_bs,
        refuse=True,
        flags=("--enable-torch-compile", "--torch-compile-max-bs"),
    ),
    Rule(
        "dp-attention-deprecated",
        "--enable-dp-attention is deprecated (use --attn-dp-size)",
        _dp_attention_deprecated,
        refuse=False,
        flags=("--enable-dp-attention",),
    ),
    Rule(
        "cuda-graph-bs-above-max-bs",
        "a decode bucket above --cuda-graph-max-bs-decode",
        _buckets_above_max_bs,
        refuse=True,
        flags=("--cuda-graph-bs-decode", "--cuda-graph-max-bs-decode"),
    ),
    Rule(
        "cuda-graph-disabled-with-buckets",
        "decode CUDA graphs disabled while bucket flags are set",
        _graphs_disabled_with_buckets,
        refuse=False,
        flags=("--disable-decode-cuda-graph", "--cuda-graph-bs-decode"),
    ),
    Rule(
        "cuda-graph-bs-above-max-running",
        "CUDA graph batch sizes above --max-running-requests",
        _graph_bs_above_running,
        refuse=False,
        flags=("--max-running-requests", "--cuda-graph-bs-decode"),
    ),
    Rule(
        "tp-size-above-gpus",
        "--tp-size larger than the GPUs of this machine",
        _tp_above_gpus,
        refuse=True,
        flags=("--tp-size",),
    ),
    Rule(
        "split-tile-overrides-num-kv-splits",
        "--triton-attention-split-tile-size makes num-kv-splits moot",
        _split_tile_with_splits,
        refuse=False,
        flags=("--triton-attention-split-tile-size", "--triton-attention-num-kv-splits"),
    ),
)


@dataclass(frozen=True)
class RuleHit:
    rule: str
    message: str
    refuse: bool

    def __str__(self) -> str:
        return f"[{self.rule}] {self.message}" + ("" if self.refuse else " (warning)")


def apply_rules(args: Sequence[str], ctx: dict[str, Any] | None = None, rules: Sequence[Rule] = RULES) -> list[RuleHit]:
    """Every rule that fires for ``args``; each hit is logged with the rule's name."""
    flags = args_to_dict(args)
    hits = []
    for rule in rules:
        msg = rule.check(flags, ctx or {})
        if msg:
            hit = RuleHit(rule.name, msg, rule.refuse)
            _logger.log(logging.WARNING if rule.refuse else logging.INFO, "rule fired: %s", hit)
            hits.append(hit)
    return hits
