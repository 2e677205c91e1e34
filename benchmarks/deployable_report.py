"""The markdown of issue 42's GPU runs (``benchmarks/deployable_search.sh``): per search (with and without
``deployable_only``), the export's two predictions as the search recorded them, the same re-measured by ``tuner verify``,
and ``tuner explain``'s command-against-best table; the date, GPU and commit are read from the export itself.

    python benchmarks/deployable_report.py out/off out/on > benchmarks/results/deployable/h200/<date>_<commit>.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def section(d: Path) -> list[str]:
    launch = next((d / "export").glob("*/launch.sh"))
    text = launch.read_text()
    head = [ln[2:] for ln in text.splitlines() if ln.startswith("# ")]
    env = next((ln for ln in head if ln.startswith("environment:")), "environment: ?")
    exported = head[0]
    keep = [ln for ln in head if re.match(r"\s*(this command|with these code changes):", ln)]
    code = head[head.index(next(ln for ln in head if ln.startswith("with these code changes (the twin's best"))):]
    code = code[:next((i for i, ln in enumerate(code) if not ln.strip()), len(code))]
    cmd = [ln.strip() for ln in text.split("exec ", 1)[1].splitlines()]
    verify = (d / "verify.txt").read_text().splitlines() if (d / "verify.txt").exists() else ["(no verify output)"]
    explain = (d / "explain.md").read_text() if (d / "explain.md").exists() else ""
    table = explain.split("## The exported command against the twin's best", 1)[1].split("\n## ", 1)[0] \
        if "## The exported command against" in explain else "\n(not in explain's report)\n"
    return [f"## {d.name}: `{launch.parent.name}`", "", f"- {exported}", f"- {env}", f"- source: `{launch}`", "",
            "Predictions recorded by the search:", "", "```", *keep, *code, "```", "", "The command:", "", "```",
            *cmd, "```", "", "Re-measured by `tuner verify launch.sh` (both):", "", "```", *verify, "```", "",
            "`tuner explain`:", table.strip(), ""]


def main(argv: list[str]) -> int:
    out = ["# Issue 42: the twin's best against the exported command, with and without deployable_only", "",
           f"Written by `benchmarks/deployable_report.py {' '.join(argv)}` from the folders "
           "`benchmarks/deployable_search.sh` filled.", ""]
    for a in argv:
        out += section(Path(a))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
