"""Warm start: a twin (workload) study's best configurations, translated into a server space, run first.

``tuner search --target sglang --warm-start URL#STUDY`` reads the twin study's successful trials, best first,
translates each into the server space through the twin knobs' ``server:`` annotations (a knob's SGLang flag or
variable is looked up among the server space's parameters by that flag or variable; a value the server space does
not offer is left at its default and named in the log), and enqueues the distinct translations right after the
baseline. TPE then learns from the real trials as usual. Each warm-started trial records the twin trial it came
from, so ``tuner explain`` can set what the twin predicted against what the server measured.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from search_spaces import Param, ResolvedSpace, Space, load_space_text
from storage import Repo
from tuner.errors import SearchError
from tuner.search.sampling import suggestable

_logger = logging.getLogger(__name__)

WARM_ATTR = "tuner_warm_start"
"""Optuna user attribute of a warm-started trial: ``{"study", "trial", "url"}`` of the twin trial it came from."""
STUDY_ATTR = "tuner_warm_start_source"
"""Optuna study attribute: the ``URL#STUDY`` the study was warm-started from."""
TOP = 5
"""How many distinct translated configurations are enqueued."""
SERVER_DEFAULT = "server_default"


@dataclass
class Translation:
    twin_trial: int
    twin_value: float
    params: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def parse_source(text: str) -> tuple[str, str]:
    """``URL#STUDY`` -> (url, study); :class:`SearchError` naming the value otherwise."""
    url, sep, study = text.rpartition("#")
    if not sep or not url or not study:
        raise SearchError(
            f"--warm-start must be URL#STUDY, but got {text!r}; e.g. "
            "--warm-start sqlite:///tuner.db#dsv4-flash-workload"
        )
    return url, study


def _server_param(server: Space, name: str, *, env: bool) -> Param | None:
    for q in server.params:
        if (q.env if env else q.flag) == name:
            return q
    return None


def _server_value(q: Param, v: Any) -> tuple[bool, Any]:
    """The server parameter's own value for the SGLang value ``v`` (``None``: the server's default)."""
    if v is None:
        return True, SERVER_DEFAULT if SERVER_DEFAULT in q.choices() else q.default
    if q.type == "bool":
        return (True, bool(v)) if isinstance(v, bool) else (False, None)
    if q.type == "float":
        return (True, float(v)) if isinstance(v, (int, float)) and q.contains(float(v)) else (False, None)
    for c in q.choices():
        if str(c).lower() == str(v).lower():
            return True, c
    return False, None


def translate(twin: Space, twin_params: dict[str, Any], server: ResolvedSpace) -> tuple[dict[str, Any], list[str]]:
    """The server space's values for a twin configuration (only the parameters a twin knob sets), and notes on
    what could not be carried over."""
    wanted: dict[str, Any] = {}
    notes: list[str] = []
    for p in twin.params:
        if p.name not in twin_params or p.server is None or not p.server.name:
            continue
        q = _server_param(server.space, p.server.name, env=p.server.env is not None)
        if q is None:
            notes.append(f"{p.name}: the server space has no parameter for {p.server.name}")
            continue
        value = twin_params[p.name]
        v = value if p.type == "buckets" else p.server.server_value(value)
        ok, sv = _server_value(q, v)
        if not ok:
            notes.append(f"{p.name}={value}: {p.server.name} {v!r} is not a value of `{q.name}`; left at its default")
            continue
        wanted[q.name] = sv
    return wanted, notes


def twin_translations(source: str, server: ResolvedSpace, *, top: int = TOP) -> list[Translation]:
    """The twin study's successful trials, translated, its recorded best first and then the others by value; the
    first ``top`` distinct ones (none equal to the server baseline)."""
    url, study = parse_source(source)
    try:
        repo = Repo(url)
        run = repo.get_run(study) if repo.has_schema() else None
    except Exception as exc:  # noqa: BLE001 - a bad URL or driver: one line
        raise SearchError(
            f"--warm-start: cannot open {url!r} ({str(exc).splitlines()[0]}); give URL#STUDY of a twin study"
        ) from None
    if run is None:
        raise SearchError(f"--warm-start: no study {study!r} in {url}; `tuner status --storage {url}` lists them")
    if run.target != "workload":
        raise SearchError(f"--warm-start: study {study!r} is a {run.target} study; give a workload (twin) study")
    twin = load_space_text(run.space_yaml, source=run.space_name)
    trials = [t for t in repo.list_trials(run.id, outcome="ok") if t.value is not None and t.repeat_of is None]
    # the twin's decided best first (a median over its runs when it was confirmed), then by single timings
    trials.sort(key=lambda t: (t.number != run.best_trial_number, -t.value if run.direction != "minimize" else t.value))
    baseline = server.defaults()
    out: list[Translation] = []
    seen = {repr(sorted(baseline.items()))}
    for t in trials:
        wanted, notes = translate(twin, t.params, server)
        params = server.walk(
            lambda q: (
                wanted[q.name] if q.name in wanted and q.contains(wanted[q.name]) else baseline.get(q.name, q.default)
            )
        )
        key = repr(sorted(params.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(Translation(t.number, t.value, params, notes))
        if len(out) >= top:
            break
    return out


def enqueue_warm_start(study, server: ResolvedSpace, source: str, translations: list[Translation]) -> None:
    """Enqueue the twin's translated best configurations (after the baseline, already queued)."""
    url, name = parse_source(source)
    study.set_user_attr(STUDY_ATTR, source)
    for tr in translations:
        for n in tr.notes:
            _logger.info("warm start from twin trial %d: %s", tr.twin_trial, n)
        study.enqueue_trial(
            suggestable(server, tr.params), user_attrs={WARM_ATTR: {"url": url, "study": name, "trial": tr.twin_trial}}
        )
    _logger.info("warm start: %d configuration(s) from twin study %s enqueued", len(translations), name)
