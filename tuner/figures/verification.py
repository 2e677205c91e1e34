"""What ``tuner verify`` compares: the figures an exported script recorded (its ``# tuner-recorded:`` line) and the
result of running it again (:class:`VerifyResult`). Each target re-runs its own exports
(:meth:`tuner.targets.Target.verify_export`); ``tuner.export.verify`` picks the target a script names."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import ExportError
from tuner.measurement import Outcome

RECORD_MARK = "# tuner-recorded: "
"""The header line holding the recorded figures as JSON; ``tuner verify`` compares a re-run against it."""


@dataclass
class VerifyResult:
    ok: bool
    outcome: Outcome
    metric: str
    value: float | None
    recorded_value: float | None
    by_level: dict[int, float] = field(default_factory=dict)
    recorded_by_level: dict[int, float] = field(default_factory=dict)
    ratios: dict[int, float] = field(default_factory=dict)
    tolerance: float = 0.15
    reason: str = ""
    log: str = ""
    duration_s: float = 0.0
    command: VerifyResult | None = None
    """A workload export's second prediction: the command's configuration re-measured (remeasure_command.sh)."""
    plugin: VerifyResult | None = None
    """A workload export with an SGLang plug-in: the command's configuration with the plug-in loaded
    (remeasure_plugin.sh)."""

    def lines(self) -> list[str]:
        head = "verified" if self.ok else "NOT verified"
        # a run that measured and missed is "NOT verified" alone: "outcome ok" there reads as a pass
        outcome = "" if not self.ok and self.outcome is Outcome.OK else f"outcome {self.outcome.value}, "
        out = [
            f"{head}: {self.metric} {self.value if self.value is None else round(self.value, 3)} "
            f"(recorded {self.recorded_value if self.recorded_value is None else round(self.recorded_value, 3)}, "
            f"tolerance {self.tolerance:.0%}, {outcome}{self.duration_s:.1f}s)"
        ]
        for c in sorted(self.recorded_by_level):
            got = self.by_level.get(c)
            ratio = self.ratios.get(c)
            out.append(
                f"  c={c}: {got if got is None else round(got, 3)} vs {round(self.recorded_by_level[c], 3)}"
                + (f" ({ratio:.2f}x)" if ratio is not None else "")
            )
        if self.reason:
            out.append(f"  {self.reason}")
        if self.command is not None:
            out.append("the exported command's configuration (remeasure_command.sh), the second prediction:")
            out += ["  " + ln for ln in self.command.lines()]
        if self.plugin is not None:
            out.append("the exported command with the SGLang plug-in loaded (remeasure_plugin.sh):")
            out += ["  " + ln for ln in self.plugin.lines()]
        return out


def read_recorded(script: str | os.PathLike) -> dict[str, Any]:
    """The figures an exported script recorded (its ``# tuner-recorded:`` line); ``ExportError`` when absent."""
    try:
        text = Path(script).read_text()
    except OSError as exc:
        raise ExportError(
            f"cannot read launch script {str(script)!r} ({exc.strerror}); give the exported launch.sh"
        ) from None
    for line in text.splitlines():
        if line.startswith(RECORD_MARK):
            try:
                return json.loads(line[len(RECORD_MARK) :])
            except json.JSONDecodeError as exc:
                raise ExportError(
                    f"{script}: the `{RECORD_MARK.strip()}` line is not JSON ({exc.msg}); re-export it"
                ) from None
    raise ExportError(f"{script}: no `{RECORD_MARK.strip()}` line; only scripts exported by tuner can be verified")


def compare(result: VerifyResult, *, maximize: bool) -> None:
    """Fill ``result.ratios``, ``ok`` and ``reason`` from its new and recorded figures per level."""
    worst = []
    for c, want in result.recorded_by_level.items():
        got = result.by_level.get(c)
        if got is None or want == 0 or math.isnan(got):
            continue
        result.ratios[c] = got / want
        tol = result.tolerance
        if (got < want * (1 - tol)) if maximize else (got > want * (1 + tol)):
            worst.append(f"c={c}: {got:.3g} vs recorded {want:.3g}")
    result.ok = not worst
    if worst:
        result.reason = f"outside {result.tolerance:.0%} of the recorded figures: " + "; ".join(worst)


def combine_levels(rec: dict[str, Any], by_level: dict[int, float]) -> float:
    vals = [v for v in by_level.values()]
    combine = rec.get("combine", "geomean")
    if combine == "level" and rec.get("level") in by_level:
        return by_level[rec["level"]]
    if combine == "geomean":
        return 0.0 if any(v <= 0 for v in vals) else math.exp(sum(math.log(v) for v in vals) / len(vals))
    if combine == "min":
        return min(vals)
    return sum(vals) / len(vals)
