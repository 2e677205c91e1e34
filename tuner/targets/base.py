"""The abstract target: what one trial runs, and how its configuration is checked before any GPU time is spent."""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from search_spaces import ResolvedSpace
from tuner.errors import ExportError
from tuner.figures.verification import VerifyResult
from tuner.measurement import Measurement
from tuner.settings import CommonSettings

_logger = logging.getLogger(__name__)

Reporter = Callable[[int, float], bool]
"""``report(step, value) -> should_stop``: an intermediate value (one concurrency level); True means pruned."""


@dataclass
class PreflightReport:
    """What will run and what will not, and why. ``errors`` stop the search before its first trial."""

    target: str
    will_run: list[str] = field(default_factory=list)
    will_not_run: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    trial_s: float | None = None
    """What one trial takes, when the target knows (a space's estimate or a probe launch): the dry-run's plan."""

    @property
    def ok(self) -> bool:
        return not self.errors

    def plan(self, budget_s: float) -> None:
        """Add how many trials of :attr:`trial_s` fit in ``budget_s`` to the facts (nothing when it is unknown)."""
        if self.trial_s and self.trial_s > 0:
            self.facts["trials that fit the budget"] = (
                f"about {int(budget_s // self.trial_s)} ({budget_s:.0f} s / {self.trial_s:.0f} s a trial)"
            )

    def lines(self) -> list[str]:
        out = [f"preflight for target `{self.target}`:"]
        out += [f"  {k}: {v}" for k, v in self.facts.items()]
        out += [f"  will run: {x}" for x in self.will_run]
        out += [f"  will not run: {x}" for x in self.will_not_run]
        out += [f"  rule: {x}" for x in self.rules]
        out += [f"  ERROR: {x}" for x in self.errors]
        return out


SGLANG_PLUGIN_ENV = "TUNER_SGLANG_PLUGIN"
"""Where an export's remeasure_plugin.sh tells a target's re-measure to load the export's SGLang plug-in folder."""


@dataclass
class LaunchSpec:
    """How to run a configuration outside the tuner: an argv, extra environment, and files to ship beside it."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""
    remeasure_argv: list[str] | None = None
    """The command that re-measures the configuration (defaults to ``argv``)."""
    host: str | None = None
    """The address the launched server binds (server targets): what ``tuner verify`` dials."""


@dataclass
class Deployment:
    """What a user deploys for a configuration where that is another program's command, not the target's own launch
    (:meth:`Target.deployment`; the workload twin: SGLang's launch command). The export writes :attr:`render`'s
    script as launch.sh, headed by both predictions (the command's configuration and the best) and :attr:`lines`."""

    params: dict[str, Any]
    """The configuration the command runs: the best's, with each value the command cannot give replaced."""
    same: bool
    """Whether the command runs the best configuration itself (nothing replaced or moved)."""
    title: str
    """What the script is, for its first header line (e.g. ``SGLang launch command``)."""
    predicted: str
    """The header's caution that the figures are the target's predictions, and how to confirm them."""
    by: str
    """Who made the predictions, in the header's words (e.g. ``the twin``)."""
    predictions: str
    """The line that introduces the two predictions (what was measured, against what)."""
    lines: list[str]
    """Header lines: what the command sets for each knob, and what it cannot give (the code changes)."""
    footer: list[str]
    """The header's last lines: how to run the script."""
    render: Callable[[list[str], str, str | None], str]
    """``render(header, record_line, config_dir)``: the script's text (``config_dir``: the folder beside it holding
    the tuned configs it reads, or None)."""
    copy_configs: Callable[[list[Path], Path], bool]
    """``copy_configs(kernel_dirs, dest)``: copy the tuned configs the command reads into ``dest``; True if any."""


class Target(abc.ABC):
    """What a trial runs.

    Contract:

    - ``__init__(resolved, settings)`` must be cheap and must not touch a GPU: the search process builds one to
      run :meth:`preflight` and :meth:`launch_spec`; each trial builds its own inside a fresh subprocess.
    - :meth:`preflight` runs once before any trial. It checks every parameter value the space can produce
      against what is installed (a flag the server does not accept, a mode this torch cannot do) and returns
      a :class:`PreflightReport`; it never raises for a bad configuration, it reports it.
    - :meth:`check` runs before each trial in the search process: a reason string when the params cannot
      run (the trial becomes ``invalid_config`` without spending a subprocess), else ``None``.
    - :meth:`evaluate` runs in the trial's own subprocess (see ``tuner.execution.isolation``); it must return by
      ``deadline`` (``time.time()`` seconds) or it is killed and recorded as ``timeout``. It returns a
      :class:`Measurement` whose outcome classifies any failure; raising is allowed (the worker classifies the
      exception) but a crash, hang or CUDA error only ever fails this one trial.
    - ``report(step, value)`` passes an intermediate value (e.g. one concurrency level) to the pruner; when it
      returns True the evaluation should stop and return an outcome ``pruned``.
    """

    name: str = "abstract"
    gpus_per_trial: int = 0
    persistent_worker: bool = False
    """True: trials run one after another in a long-lived worker process per GPU set (short trials that must not
    pay an interpreter + torch + CUDA start each). The kernels target sets it (a config trial is ~0.1-3 s of compile
    and timing) unless its setting ``persistent_worker`` is false."""

    baseline_runs: int = 1
    """Times the baseline is timed before any other trial (the setting ``baseline_runs`` overrides it). 1 where a run
    is dear (a server start), re-run at the end; the workload twin, whose trials take seconds, times it twice up
    front (after one untimed warm-up run in its fresh worker), so its spread is known before any ratio is shown."""

    Settings: ClassVar[type[CommonSettings]] = CommonSettings
    """The typed settings this target accepts (its own model extends :class:`~tuner.settings.CommonSettings`)."""

    def __init__(self, resolved: ResolvedSpace, settings: dict[str, Any] | None = None) -> None:
        self.resolved = resolved
        self.space = resolved.space
        self.settings = {**self.space.settings, **(settings or {})}
        """The settings as given (the space's, then ``--set``): what trial processes and the stored run get."""
        self.config = self.Settings.parse(self.settings, owner=f"target `{self.name}`")
        """The same, typed and with every default filled in: what the target reads."""

    def preflight(self) -> PreflightReport:
        report = PreflightReport(target=self.name)
        report.will_run.append(
            f"{len(self.resolved.params)} tunable parameters: " + ", ".join(p.name for p in self.resolved.params)
        )
        report.will_not_run += [str(i) for i in self.resolved.inactive]
        report.rules += list(self.resolved.notes)
        for c in self.space.constraints:
            report.rules.append(f"constraint `{c.name}`" + (f": {c.message}" if c.message else ""))
        return report

    def check(self, params: dict[str, Any]) -> str | None:
        bad = self.space.violated_constraints(params)
        if bad:
            names = ", ".join(f"`{c.name}`" for c in bad)
            return f"violates constraint {names}"
        return None

    def gpus_for(self, params: dict[str, Any]) -> int:
        """GPUs one trial with ``params`` needs (for leasing); 0 on a CPU-only target."""
        return self.gpus_per_trial

    @abc.abstractmethod
    def evaluate(self, params: dict[str, Any], deadline: float, report: Reporter | None = None) -> Measurement:
        """Run one trial; see the class docstring."""

    @abc.abstractmethod
    def launch_spec(self, params: dict[str, Any]) -> LaunchSpec:
        """The command that deploys (or re-measures) ``params`` outside the tuner; used by the export."""

    # -- optional hooks: each does nothing unless a target overrides it ---------------------------------------
    def kernel_config_dirs(self) -> list[str]:
        """Directories of tuned kernel configs this target's launch uses (copied beside the launch script)."""
        return []

    def kernel_shapes(self) -> list[tuple]:
        """The ``(kernel, shape)`` cases this space's configurations run (``(kernel, shape, dtype)`` where the dtype is
        not bfloat16), for a kernel phase before the first trial (``--set kernel_phase=true``); none by default."""
        return []

    def canonical_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with every value that cannot change what a trial runs set to one fixed value, so that the
        search finds two configurations that run the same thing to be one (the second is a repeat, not run);
        ``params`` themselves by default."""
        return params

    def known_failure(self, repo: Any, params: dict[str, Any], run_id: int | None = None) -> str | None:
        """Why ``params`` need not run: the same launch already failed, as kept in the study's storage ``repo`` (a
        :class:`storage.Repo`), in study run ``run_id`` (the search passes its own). The search never asks it about
        the baseline. ``None`` by default."""
        return None

    def remember_failure(
        self, repo: Any, run_id: int, number: int, params: dict[str, Any], measurement: Measurement
    ) -> None:
        """Keep trial ``number``'s failed launch in ``repo`` for :meth:`known_failure`; nothing by default."""

    def min_trial_s(self) -> float:
        """The fewest seconds a trial needs to give a figure at all; the search starts none with less left. 0 by
        default (any time left may do)."""
        return 0.0

    def trial_settings(
        self, repo: Any, run_id: int, *, is_baseline: bool, incumbent: int | None = None
    ) -> dict[str, Any]:
        """Settings one trial's process gets beside the study's, read from the study's storage ``repo`` in the search
        process before the trial (e.g. the baseline's greedy completions to compare with; the stored figures of
        ``incumbent``, the best trial so far, that a trial may be pruned against); none by default."""
        return {}

    def after_trial(
        self, repo: Any, run_id: int, number: int, measurement: Measurement, *, is_baseline: bool
    ) -> Measurement:
        """In the search process, after trial ``number`` ran and before it is stored: keep what it handed back
        (``measurement.data``) in ``repo`` for later trials, and settle its result against what is stored there;
        returns the measurement to store. Returns it unchanged by default."""
        return measurement

    def worker_reusable(self, measurement: Measurement) -> bool:
        """In a persistent worker (:attr:`persistent_worker`), after a trial ended with ``measurement``: whether the
        process may run the next trial. The worker retires it anyway after a timeout, a prune, a death or an outcome
        that may leave the CUDA context broken (crash, OOM); True by default."""
        return True

    def constraint_names(self) -> list[str]:
        """This target's own Optuna constraints beside the objective's SLO constraints: the levels of the
        ``constraint`` metric rows a trial stores (a value <= 0 is feasible; a missing row counts as violated).
        None by default."""
        return []

    def side_by_side(self, best_params: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """At the end of a search, configurations to re-measure beside the chosen best ``best_params``, each with a
        label (the workload twin: the exported command's configuration, so its export gives both predictions
        measured); the best itself is re-run between them. None by default."""
        return []

    def plugin_measurements(self, params: dict[str, Any]) -> list[list[str]]:
        """At the end of a search, on its GPU: the argument lists of ``python -m tuner.export.sglang_plugin_measure``
        for the shapes at which the deployment of ``params`` calls an SGLang function the exported SGLang plug-in can
        replace (its kernels are timed beside SGLang's there, and only the faster ones ship). None by default."""
        return []

    def deployment(
        self, params: dict[str, Any], *, environment: dict[str, Any] | None, repo: Any, run_id: int
    ) -> Deployment | None:
        """What a user deploys for ``params`` when it is not :meth:`launch_spec`'s command (the workload twin: SGLang's
        command for the GPU architecture of the run's stored ``environment``, with the ablations kept in ``repo``
        for study run ``run_id``); the export then writes it as launch.sh and the launch spec beside it as the
        target's own re-measure. None by default: launch.sh runs the launch spec."""
        return None

    @classmethod
    def verify_export(
        cls,
        path: Path,
        recorded: dict[str, Any],
        *,
        tolerance: float = 0.15,
        timeout_s: float = 3600.0,
        settings: dict[str, Any] | None = None,
    ) -> VerifyResult:
        """``tuner verify``: run the launch script ``path`` this target exported once more and compare with the
        figures it ``recorded`` (its ``# tuner-recorded:`` line); never raises for a failed run. A target whose
        exports cannot be re-run says so (``ExportError``), the default."""
        raise ExportError(f"{path}: target {cls.name!r} exports no script `tuner verify` can re-run")

    def use_kernel_configs(self, config_dir: str) -> dict[str, Any]:
        """Settings that make later trials (and the export) use the configs a kernel phase wrote to
        ``config_dir``; none by default."""
        return {}
