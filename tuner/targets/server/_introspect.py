"""Dump a server's argparse parser as JSON and check candidate values with the parser's own types.

Run by path with the *server's* Python (stdlib only, no ``tuner`` import needed there)::

    python _introspect.py sglang.srt.server_args:ServerArgs.add_cli_args  < checks.json

``checks.json`` is ``[[flag, [value, ...]], ...]``; each value is converted with the action's own ``type`` and
checked against its ``choices``. Output (stdout, one JSON object): ``{"version", "options": [...], "checks": [...]}``.
"""

import argparse
import importlib
import json
import sys


def _build(spec):
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    parser = argparse.ArgumentParser(add_help=False)
    obj(parser)
    return parser


def _describe(action):
    kind = type(action).__name__
    return {
        "names": list(action.option_strings),
        "dest": action.dest,
        "kind": kind,
        "takes_value": action.nargs != 0,
        "nargs": action.nargs if action.nargs is None or isinstance(action.nargs, (int, str)) else str(action.nargs),
        "choices": None if action.choices is None else [str(c) for c in action.choices],
        "type": getattr(action.type, "__name__", None) if action.type is not None else None,
        "default": (
            action.default if isinstance(action.default, (str, int, float, bool, type(None))) else str(action.default)
        ),
        "help": (action.help or "")[:400] if action.help is not argparse.SUPPRESS else "",
        "deprecated": kind.startswith("Deprecated") or bool(getattr(action, "deprecated", False)),
        "removed": kind == "DeprecatedAction",
        "new_flag": getattr(action, "new_flag", None) or None,
    }


def _check(action, values):
    errors = []
    for raw in values:
        text = str(raw)
        try:
            converted = action.type(text) if callable(action.type) else text
        except Exception as exc:  # noqa: BLE001 - the parser's own type refused it
            errors.append(
                f"{text!r} is not accepted by {'/'.join(action.option_strings)} ({type(exc).__name__}: {exc})"
            )
            continue
        names = [str(c) for c in action.choices] if action.choices is not None else []
        if action.choices is not None and converted not in action.choices and text not in names:
            errors.append(f"{text!r} is not one of the choices of {action.option_strings[0]}: {sorted(names)}")
    return errors


def main():
    spec = sys.argv[1]
    parser = _build(spec)
    actions = [a for a in parser._actions if a.option_strings]
    by_name = {n: a for a in actions for n in a.option_strings}
    try:
        checks = json.loads(sys.stdin.read() or "[]")
    except ValueError:
        checks = []
    results = []
    for flag, values in checks:
        action = by_name.get(flag)
        results.append({"flag": flag, "errors": _check(action, values) if action is not None else []})
    version = None
    try:
        root = importlib.import_module(spec.split(".")[0])
        version = getattr(root, "__version__", None)
    except Exception:  # noqa: BLE001
        pass
    json.dump({"version": version, "options": [_describe(a) for a in actions], "checks": results}, sys.stdout)


if __name__ == "__main__":
    main()
