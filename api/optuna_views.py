"""What the API derives from Optuna's own study: parameter importances and plotly figures (as JSON).

The costly ones (importances, the history figure) run in the API's worker process (``*_in_worker``, called
through ``ApiState.derived``), so their seconds of CPU on a large study never hold the server's GIL.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timezone

import optuna
from optuna.trial import TrialState

from api.schemas import ImportancesOut, ParamImportance
from storage import Run
from storage.segments import active_seconds

_logger = logging.getLogger(__name__)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _complete(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def importances(name: str, study: optuna.Study | None) -> ImportancesOut:
    """Optuna's default importances (PED-ANOVA in Optuna 5) over the completed trials, or an empty list with the reason why not."""
    if study is None:
        return ImportancesOut(study=name, n_complete=0, importances=[], reason="Optuna holds no study of this name")
    if len(study.directions) != 1:
        return ImportancesOut(study=name, n_complete=0, importances=[], reason="multi-objective study")
    done = _complete(study)
    params = {p for t in done for p in t.params}
    empty = dict(study=name, n_complete=len(done), importances=[])
    if len(done) < 2:
        return ImportancesOut(**empty, reason=f"needs at least 2 complete trials, has {len(done)}")
    if len(params) < 2:
        return ImportancesOut(**empty, reason=f"needs at least 2 parameters, the trials have {len(params)}")
    try:
        values = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError) as exc:
        _logger.info("importances of %r not computable: %s", name, exc)
        return ImportancesOut(**empty, reason=f"not computable: {exc}")
    items = [ParamImportance(param=p, importance=v) for p, v in values.items() if math.isfinite(v)]
    if not items:
        return ImportancesOut(**empty, reason="no parameter varied among the complete trials")
    return ImportancesOut(study=name, n_complete=len(done), importances=items)


def history_figure_json(run: Run, study: optuna.Study | None) -> str:
    """Optuna's optimization history with the searched time on x (every segment of a resumed study, without the
    gaps between them) and the baseline as a line."""
    import plotly.graph_objects as go

    if study is None or not _complete(study):
        fig = go.Figure()
        fig.update_layout(title="Optimization history (no complete trials yet)")
    else:
        fig = optuna.visualization.plot_optimization_history(study, target_name=run.objective or "objective")
        at: dict[int, float] = {}
        for t in study.get_trials(deepcopy=False):
            if t.datetime_complete is not None:
                at[t.number] = active_seconds(run, _utc(t.datetime_complete))
        for trace in fig.data:
            numbers = list(trace.x or ())
            if numbers and all(isinstance(n, int) and n in at for n in numbers):
                trace.x = [at[n] for n in numbers]
                trace.text = [f"trial {n}" for n in numbers]
                trace.hovertemplate = "%{text}<br>%{x:.1f} s<br>%{y}<extra></extra>"
        fig.update_xaxes(title_text="elapsed (s)")
        fig.update_layout(title="Best so far against time")
    if run.baseline_value is not None and math.isfinite(run.baseline_value):
        fig.add_hline(y=run.baseline_value, line_dash="dash", line_color="gray", annotation_text="baseline")
    return fig.to_json()


def importances_figure_json(imp: ImportancesOut, target_name: str) -> str:
    """A horizontal bar per parameter, most important on top (as Optuna's ``plot_param_importances`` draws it),
    from importances already computed: drawing them costs no second evaluation."""
    import plotly.graph_objects as go

    fig = go.Figure()
    if not imp.importances:
        fig.update_layout(title=f"Parameter importances ({imp.reason})")
        return fig.to_json()
    rows = list(reversed(imp.importances))
    fig.add_trace(go.Bar(x=[r.importance for r in rows], y=[r.param for r in rows], orientation="h",
                         text=[f"{r.importance:.2f}" for r in rows], textposition="outside",
                         hovertemplate="%{y}: %{x:.3f}<extra></extra>"))  # fmt: skip
    fig.update_layout(title=f"Parameter importances for {target_name} ({imp.n_complete} complete trials)",
                      xaxis_title="importance", yaxis_title="parameter")  # fmt: skip
    return fig.to_json()


def _utc(t: datetime) -> datetime:
    """Optuna's naive local time as naive UTC (what the ``tuner_`` tables store)."""
    return t.astimezone(timezone.utc).replace(tzinfo=None)


# -- in the API's worker process ------------------------------------------------------------------------------
_opened: dict[tuple[str, str], object] = {}


def _repo(url: str):
    """This worker's Repo on ``url``, opened once (it creates nothing)."""
    if ("repo", url) not in _opened:
        from storage import Repo

        _opened["repo", url] = Repo(url, create=False)
    return _opened["repo", url]


def _optuna(url: str) -> optuna.storages.RDBStorage:
    """This worker's Optuna storage on ``url``, opened once; it never creates Optuna's tables."""
    if ("optuna", url) not in _opened:
        _opened["optuna", url] = optuna.storages.RDBStorage(url, skip_table_creation=True,
                                                            skip_compatibility_check=True)  # fmt: skip
    return _opened["optuna", url]


def _study(url: str, name: str) -> optuna.Study | None:
    """The Optuna study of that name, or None when Optuna holds none (yet: no Optuna tables, no such study)."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return optuna.load_study(study_name=name, storage=_optuna(url))
    except (KeyError, SQLAlchemyError, optuna.exceptions.OptunaError) as exc:
        _logger.info("optuna study %r not loadable: %s", name, exc)
        return None


def importances_in_worker(url: str, name: str) -> ImportancesOut:
    return importances(name, _study(url, name))


def history_in_worker(url: str, name: str) -> str:
    run = _repo(url).get_run(name)
    if run is None:  # removed since the request found it: the storage is not what it was
        from storage import StorageError

        raise StorageError(f"study {name!r} is no longer in the storage")
    return history_figure_json(run, _study(url, name))
