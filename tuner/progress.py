"""The live display of a search (Rich): elapsed / budget, trial counts, best and x baseline, current params."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tuner.budget import format_seconds
from tuner.search.context import Progress, SearchContext, TrialSummary
from tuner.search.winner import baseline_of, group_runs


def _fmt_params(params: dict[str, Any], width: int = 110) -> str:
    s = ", ".join(f"{k}={v}" for k, v in params.items())
    return s if len(s) <= width else s[: width - 1] + "…"


def baseline_line(ctx: SearchContext) -> str:
    """The one line that says which figure every "x baseline" divides by, and how far its runs were apart."""
    group = baseline_of(group_runs(ctx.trials, ctx.key_of))
    base, runs = group.median, list(group.values)
    unit = ctx.resolved.space.objective.unit
    if len(runs) > 1:
        how = f"median of {len(runs)} runs, {min(runs):.2f}-{max(runs):.2f}, spread {group.spread:.1%}"
    else:
        how = "one run; re-run at the end when time allows"
    return f'baseline (the space\'s defaults): {base:.2f} {unit} ({how}); every "x baseline" divides by it'


class RichProgress(Progress):
    """Draws a live panel on a terminal; prints one line per trial otherwise (CI logs, pipes)."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.live: Live | None = None
        self.ctx: SearchContext | None = None
        self.current: tuple[int, dict[str, Any], float] | None = None
        self.messages: list[str] = []
        self.baseline_said: set[str] = set()

    def started(self, ctx: SearchContext) -> None:
        self.ctx = ctx
        space = ctx.resolved.space
        self.console.print(
            f"[bold]tuner search[/] study [cyan]{escape(ctx.run.study_name)}[/] · target "
            f"{escape(ctx.target.name)} · space {escape(space.name)} ({escape(str(space.source))}) · "
            f"budget {format_seconds(ctx.deadline.budget_s)}"
        )
        self.console.print(
            f"objective: {space.objective.describe()} ({space.objective.direction}); "
            f"{len(ctx.resolved.params)} tunable parameters on {ctx.hardware.gpu_name}",
            markup=False,
        )
        for item in ctx.resolved.inactive:
            self.console.print(f"  [dim]{escape(str(item))}[/]", highlight=False)  # e.g. `tuner[flashmla]`
        if self.console.is_terminal:
            self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self.live.start()

    def trial_started(self, number: int, params: dict[str, Any]) -> None:
        self.current = (number, params, time.time())
        self._refresh()

    def trial_finished(self, summary: TrialSummary, ctx: SearchContext) -> None:
        self.current = None
        if ctx.ratios_ready and ctx.run.study_name not in self.baseline_said:  # once per study (kernel sub-studies)
            self.baseline_said.add(ctx.run.study_name)
            self.message(baseline_line(ctx))
        if self.live is None:
            # the baseline's median, once timed as often as planned: the figure the final line uses too
            base = ctx.baseline_value if ctx.ratios_ready else None
            val = f"{summary.value:.2f}" if summary.value is not None else "-"
            ratio = f" ({summary.value / base:.2f}x baseline)" if (summary.value and base) else ""
            tag = " [baseline]" if summary.is_baseline else ""
            if summary.repeat_of is not None:
                tag = " [" + summary.reason.split(":")[0] + "]"
            reason = f" — {summary.reason[:120]}" if summary.outcome != "ok" and summary.reason else ""
            if summary.served:
                reason += f" — not served in full: {summary.served}"
            self.console.print(
                f"trial {summary.number:>3} {summary.outcome:<16} {val}{ratio} "
                f"{summary.duration_s:5.1f}s{tag}  {_fmt_params(summary.params, 90)}{reason}",
                highlight=False,
                markup=False,
            )
        self._refresh()

    def message(self, text: str) -> None:
        self.messages = (self.messages + [text])[-3:]
        if self.live is None:
            self.console.print(text, highlight=False, markup=False)
        self._refresh()

    def stop(self) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.stop()
            self.live = None

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._render())

    def _render(self):
        ctx = self.ctx
        if ctx is None:
            return Text("")
        c = ctx.counts
        done = sum(c.values())
        failed = sum(v for k, v in c.items() if k not in ("ok", "pruned"))
        t = Table.grid(padding=(0, 2))
        t.add_row("elapsed", f"{format_seconds(ctx.deadline.elapsed())} / {format_seconds(ctx.deadline.budget_s)}")
        t.add_row("trials", f"{done} done · {c.get('ok', 0)} ok · {failed} failed · {c.get('pruned', 0)} pruned")
        best, base = ctx.best, (ctx.baseline_value if ctx.ratios_ready else None)
        if best is not None:
            ratio = f" = {best.value / base:.2f}x baseline ({base:.2f})" if base else ""
            t.add_row("best", f"{best.value:.2f} {ctx.resolved.space.objective.unit}{ratio} (trial {best.number})")
            t.add_row("", _fmt_params(best.params))
        if self.current is not None:
            n, params, t0 = self.current
            t.add_row("running", f"trial {n} for {time.time() - t0:.0f}s: {_fmt_params(params)}")
        for m in self.messages:
            t.add_row("", Text(m, style="dim"))
        return Group(t)
