"""The long option names an SGLang release's ``server_args.py`` declares, read from its source (no import: an old
release's parser pulls in packages of its own time, torchvision's C ops, transformers' processors), one a line.

    pip download --no-deps sglang==0.5.12 -d /tmp/sgl512 && unzip -q /tmp/sgl512/*.whl 'sglang/srt/server_args.py' -d /tmp/sgl512
    python scripts/sglang_flag_names.py /tmp/sgl512/sglang/srt/server_args.py 0.5.12 > tests/server/data/sglang_0.5.12_flags.txt

It reads releases that declare their options as ``parser.add_argument("--name", ...)`` calls (0.5.12 does; 0.5.23
builds them from typed fields, so read it with its own parser: ``tuner.targets.server.flags.introspect_parser``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def flag_names(server_args_py: str | Path) -> list[str]:
    """Every ``"--name"`` passed to an ``add_argument(...)`` call in the file, sorted."""
    tree = ast.parse(Path(server_args_py).read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            names.update(
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--")
            )
    return sorted(names)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: sglang_flag_names.py SERVER_ARGS_PY RELEASE", file=sys.stderr)
        return 2
    print(f"# SGLang {argv[1]}: the long options of {Path(argv[0]).name} (scripts/sglang_flag_names.py)")
    print("\n".join(flag_names(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
