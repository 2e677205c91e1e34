"""Serving targets: launch a real OpenAI-compatible server per trial, watch it, load it, tear it down.

- :class:`CommandTarget`: any server started from a command template (an argv list with ``{port}``, ``{model}``,
  ``{host}`` placeholders); the trial's flags are appended. Its flags are checked against the command's
  ``--help`` output when it has one.
- :class:`SGLangTarget` (``tuner.targets.server.sglang_server``): ``python -m sglang.launch_server``; flags are
  checked against SGLang's own argparse parser (names, aliases, choices, the parser's own type conversion), with
  closest-name suggestions.

Settings (``Space.settings`` merged with ``--set key=value``; all optional unless noted):

========================  ===========================================================================================
``model``                 model path or name (``--model-path``; the ``model`` of requests unless
                          ``served_model_name``)
``command``               CommandTarget only, required: argv list, e.g. ``[python, server.py, --port, "{port}"]``
``help_command``          CommandTarget: argv printing the flags (default ``command + [--help]``); ``[]`` skips
``python`` / ``parser``   SGLang: the server's Python (default this one) / ``module:callable`` adding its options
``host``, ``port``        bind host (``127.0.0.1``); the port written into the exported launch (30000)
``port_range``            ports a trial may pick from (``30000-30999``)
``extra_args``, ``env``   fixed flags (list) and environment (mapping) of every launch
``kernel_config_dir``     tuned kernel configs: exported as ``TUNER_KERNEL_CONFIG_DIR``
``moe_config_dir``        fused-MoE configs: exported as ``SGLANG_MOE_CONFIG_DIR``
``health_paths``          readiness endpoints (``[/health, /v1/models]``); ``ready_patterns`` log lines
``ready_timeout_s``       readiness limit (1800; never past the trial deadline)
``fatal_grace_s``         seconds a server may linger after a fatal log line (2)
``teardown_reserve_s``    seconds kept before the deadline for teardown (15)
``levels``                concurrency levels (default: the objective's)
load                      ``api`` (completions/chat), ``prompt_len``, ``output_len``, ``length_jitter``, ``dataset``
                          (JSONL), ``requests_per_level``, ``rounds``, ``min_requests``, ``level_s`` (seconds per
                          level, 3), ``warmup_requests`` (at least; the warm-up goes on until the time to first
                          token settles, within ``warmup_s`` 30 and ``warmup_max_requests`` 64),
                          ``request_timeout_s``, ``ignore_eos`` (unset: when the server accepts it), ``seed``,
                          ``extra_body``, ``tokenizer`` (the last way to count a stream without usage, token ids or
                          one-token chunks; default ``model``, a GGUF file's own vocabulary too) (see
                          ``tuner.targets.server.loadgen``)
served                    a request the server said it finished (``finish_reason`` or usage); ``max_error_rate``
                          (0.01) and ``min_delivered`` (0.95, of the asked tokens): a level beyond either is no
                          figure, the trial ``request_error``; a goodput load beyond either misses the SLO
``allow_retry``           run a flag set whose launch failed before (the memory is in the study's storage)
``failed_scope``          ``study`` (default): only this study's failed starts refuse a launch; ``storage``: all
``torch_compile_supported``  false when the model/build is known to reject torch.compile
``greedy_check``          off unless set: ``{prompts: 8, tokens: 32, min_agreement: 0.9}``, fixed prompts completed
                          greedily once per trial and compared with the baseline's (``tuner.targets.server.greedy``)
========================  ===========================================================================================
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from search_spaces import Param
from search_spaces.schema import LevelConstraint, Objective
from storage.types import MetricRow
from tuner.errors import SettingsError, TargetError
from tuner.figures.verification import VerifyResult
from tuner.measurement import OUTSIDE_SIGNAL, Measurement, Outcome
from tuner.targets.base import LaunchSpec, PreflightReport, Reporter, Target
from tuner.targets.server import failed, greedy, loadgen
from tuner.targets.server import flags as fl
from tuner.targets.server.launch import ServerProcess, parse_port_range, pick_free_port
from tuner.targets.server.settings import ServerSettings

_logger = logging.getLogger(__name__)

DIR_ENVS = {"kernel_config_dir": "TUNER_KERNEL_CONFIG_DIR", "moe_config_dir": "SGLANG_MOE_CONFIG_DIR"}
MODEL_FILE_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".onnx")
DYING_GRACE_S = 2.0
"""After a warm-up request failed, how long the server's exit may take to show before the levels run."""
"""A ``model`` ending so names a local file, which preflight checks exists."""


def constraint_name(lc: LevelConstraint) -> str:
    """``ttft_ms_p99@c=16<=500``: the level of the ``constraint`` metric rows."""
    bounds = (f">={lc.min:g}" if lc.min is not None else "") + (f"<={lc.max:g}" if lc.max is not None else "")
    return f"{lc.metric}@{lc.level}{bounds}"


class CommandTarget(Target):
    name = "command"
    gpus_per_trial = 0
    model_path_checked = True
    """A ``model`` written as a local path that does not exist is a preflight error (else a note)."""
    Settings = ServerSettings
    config: ServerSettings

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
        from tuner.targets.server.verify import verify_script

        return verify_script(path, tolerance=tolerance, timeout_s=timeout_s, settings=settings)

    def __init__(self, resolved, settings: dict[str, Any] | None = None) -> None:
        super().__init__(resolved, settings)
        self._check_model()
        self._flags: fl.ServerFlags | None = None

    # -- the command ----------------------------------------------------------------------------------------
    def _check_model(self) -> None:
        """A command that needs ``{model}`` without a model is refused here, before any trial (and in a dry-run)."""
        if any("{model}" in str(a) for a in self.config.command or []) and not self.model:
            raise TargetError(
                "target `command`: setting `command` needs {model}, but no model is given; pass "
                "--model PATH or --set model=PATH"
            )

    @property
    def model(self) -> str:
        return self.config.model

    @property
    def host(self) -> str:
        return self.config.host

    def base_command(self, port: int | str) -> list[str]:
        cmd = self.config.command
        if not cmd:
            raise TargetError(
                "target `command` needs settings `command`: an argv list such as "
                "[python, server.py, --port, '{port}'] (never one shell string)"
            )
        subs = {"{port}": str(port), "{model}": self.model, "{host}": self.host}
        out = []
        for a in cmd:
            a = str(a)
            for k, v in subs.items():
                a = a.replace(k, v)
            out.append(a)
        return out

    def help_command(self) -> list[str]:
        cmd = self.config.help_command
        if cmd is not None:
            return [str(a) for a in cmd]
        return self.base_command(0) + ["--help"]

    def server_argv(self, args: list[str], port: int | str) -> list[str]:
        """The launch of ``args`` as deployed (the export's)."""
        return self.base_command(port) + list(self.config.extra_args) + args

    def trial_argv(self, args: list[str], port: int | str) -> list[str]:
        """The launch of ``args`` in a trial: the deployed one, unless a target measures differently."""
        return self.server_argv(args, port)

    def flag_params(self) -> list[Param]:
        return [p for p in self.space.params if p.flag]

    def flag_args(self, params: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """Flag arguments and environment for ``params`` (pinned params of the resolved space included)."""
        merged = {**self.resolved.fixed, **params}
        return fl.params_to_args(self.space.params, merged)

    def launch_env(self, param_env: dict[str, str]) -> dict[str, str]:
        env = dict(self.config.env)
        for key, var in DIR_ENVS.items():
            if getattr(self.config, key):
                env[var] = str(Path(getattr(self.config, key)).expanduser())
        env.update(param_env)
        return env

    def server_version(self) -> str:
        """The server's version as its flags report it (empty when they do not say)."""
        return (self._flags.version if self._flags else None) or ""

    def launch_command(self) -> list[str]:
        """The command of every launch, the port left out (part of the failed-flag key)."""
        return self.base_command("PORT")

    def flag_key(self, args: list[str], env: dict[str, str]) -> str:
        hw = self.resolved.hardware
        return failed.flag_set_key(
            self.launch_command(),
            list(self.config.extra_args) + args,
            env,
            server_version=self.server_version(),
            gpus=f"{hw.gpu_count}x {hw.gpu_name}" if hw.gpu_count else "cpu",
        )

    # -- the failed-flag memory (the study's storage) -----------------------------------------------------------
    def known_failure(self, repo: Any, params: dict[str, Any], run_id: int | None = None) -> str | None:
        if self.allow_retry:
            return None
        args, env = self.flag_args(params)
        scope = None if self.config.failed_scope == "storage" else run_id
        return failed.known_failure(repo, self.flag_key(args, self.launch_env(env)), scope)

    def remember_failure(
        self, repo: Any, run_id: int, number: int, params: dict[str, Any], measurement: Measurement
    ) -> None:
        if measurement.outside_signal:  # killed from outside: nothing to remember of these flags
            return
        args, env = self.flag_args(params)
        failed.remember(
            repo,
            run_id,
            number,
            key=self.flag_key(args, self.launch_env(env)),
            outcome=measurement.outcome.value,
            reason=measurement.reason,
            args=args,
            server_version=self.server_version(),
            at_start=measurement.metric("startup_s") is None,
        )  # never ready: a failed start

    # -- flags of the installed server ------------------------------------------------------------------------
    def load_flags(self, checks: list[tuple[str, list[Any]]]) -> fl.ServerFlags | None:
        argv = self.help_command()
        if not argv:
            return None
        return fl.help_flags(argv)

    def _flag_checks(self) -> list[tuple[str, list[Any]]]:
        return [(p.flag, fl.candidate_values(p)) for p in self.flag_params() if fl.candidate_values(p)]

    def preflight(self) -> PreflightReport:
        report = super().preflight()
        report.target = self.name
        try:
            flags = self.load_flags(self._flag_checks())
        except fl.FlagsUnavailable as exc:
            report.errors.append(
                f"cannot read the server's flags: {exc}; install the server or fix settings `command`/`python`"
            )
            return report
        except TargetError as exc:
            report.errors.append(str(exc))
            return report
        if flags is None:
            report.will_not_run.append("flag names are not checked (settings `help_command: []`)")
        else:
            self._flags = flags
            report.facts["server flags"] = f"{len(flags.options)} options from {flags.source}"
            if flags.version:
                report.facts["server version"] = flags.version
            self._check_flags(flags, report)
        self._check_model_path(report)
        self._report_rules(report)
        self._load_shape(report)
        self._count_plan(report)
        self._plan(report)
        gpus = self.resolved.hardware.gpu_count
        for p in self.flag_params():
            if p.flag in ("--tp-size", "--tensor-parallel-size") and gpus > 0:
                too_big = [v for v in p.choices() if isinstance(v, int) and v > gpus]
                if too_big:
                    report.will_not_run.append(
                        f"`{p.name}` values {too_big} need more than the {gpus} GPUs here "
                        "(refused by rule `tp-size-above-gpus`)"
                    )
        return report

    def _check_model_path(self, report: PreflightReport) -> None:
        """A ``model`` written as a local path (``/``, ``./``, ``~``, or a weights file's suffix) must exist here:
        a server started without it fails every trial."""
        model = self.model
        local = model.startswith(("/", "./", "../", "~")) or model.endswith(MODEL_FILE_SUFFIXES)
        if model and local and not Path(model).expanduser().exists():
            (report.errors if self.model_path_checked else report.rules).append(
                f"setting `model`: {model!r} does not exist on this machine; pass the model's path "
                "(--model PATH) or a hub name"
            )

    def _count_plan(self, report: PreflightReport) -> None:
        """How the output tokens will be counted, and whether the last fallback (a tokenizer) is there."""
        try:
            cfg = loadgen.LoadConfig.from_settings(self.settings)
        except (SettingsError, ValueError):
            return  # _load_shape says why
        line = (
            "the server's usage (asked for), else its own token ids or logprobs, else one token per streamed "
            "chunk when the first answer shows that shape (as many chunks as tokens asked)"
        )
        try:
            import transformers  # noqa: F401 - only whether it is there
        except ImportError:
            line += (
                "; no tokenizer fallback: `transformers` is not installed (pip install 'tuner[tokenizer]'), so a "
                "server streaming several tokens per chunk without usage cannot be counted"
            )
        else:
            line += (
                f", else the tokenizer {cfg.tokenizer!r}" if cfg.tokenizer else ", else no tokenizer (set `tokenizer`)"
            )
        report.facts["token count"] = line

    def _load_shape(self, report: PreflightReport) -> None:
        """The load's shape (a bad request file or contradicting shape settings: an error before any trial)."""
        try:
            cfg = loadgen.LoadConfig.from_settings(self.settings)
        except (SettingsError, ValueError) as exc:
            report.errors.append(str(exc))
            return
        if cfg.shape is not None:
            report.facts["load shape"] = cfg.shape.describe()

    def _plan(self, report: PreflightReport) -> None:
        """The seconds one trial takes: a probe launch of the defaults (``probe_launch: true``, a failure of which
        is an error: the baseline could not run either), else the space's ``trial_estimate_s``."""
        m = None
        if self.config.probe_launch and report.ok:
            t0 = time.time()
            m = self.evaluate(self.resolved.defaults(), t0 + self.config.ready_timeout_s + 600)
            if m.outcome is not Outcome.OK:
                report.errors.append(f"probe launch of the defaults: {m.outcome.value}: {m.reason}")
                return
            for note in m.data.pop("notes", None) or []:  # said once, here, before any trial
                report.rules.append(f"the server: {note}")
            split = ", ".join(
                f"{label} {m.metric(name):.1f} s"
                for label, name in (("start-up", "startup_s"), ("warm-up", "warmup_s"))
                if m.metric(name) is not None
            )
            measure = sum(r.value for r in m.metrics if r.metric == "measure_s")
            report.trial_s = m.duration_s
            report.facts["trial seconds"] = (
                f"{m.duration_s:.1f} (probe launch of the defaults: {split}, "
                f"measurement {measure:.1f} s, teardown included)"
            )
        elif self.config.trial_estimate_s:
            report.trial_s = self.config.trial_estimate_s
            report.facts["trial seconds"] = (
                f"{self.config.trial_estimate_s:g} (the space's trial_estimate_s; --set probe_launch=true measures one)"
            )
        if self.config.greedy_check is not None:
            report.facts["greedy check"] = self._greedy_plan(m if self.config.probe_launch and report.ok else None)
        if self.objective().is_goodput:  # issue 22: the boundary search replaces the levels (goodput.py)
            from tuner.targets.server import goodput

            cost = goodput.plan(self.config)
            report.facts["goodput search"] = cost.line()
            if report.trial_s and not self.config.probe_launch:  # a probe launch ran a whole search already
                report.trial_s += cost.seconds
                report.facts["trial seconds"] += f" + the goodput search's {cost.seconds:.0f} = {report.trial_s:.0f}"

    def _greedy_plan(self, probe: Measurement | None) -> str:
        """The greedy check's cost, for the dry-run's plan: its requests and tokens against the levels', and its
        seconds when a probe launch measured them."""
        check = self.config.greedy_check
        n = len(check.prompt_list())
        cfg = loadgen.LoadConfig.from_settings(self.settings)
        level_tokens = sum(cfg.n_requests(c) * cfg.output_len for c in self.objective().levels)
        line = (
            f"{n} fixed prompt{'s' if n != 1 else ''} x {check.tokens} tokens ({n * check.tokens} tokens, one "
            f"request at a time) once per trial, after the warm-up and before the levels"
            + (f" (the levels send at least {level_tokens})" if not self.objective().is_goodput else "")
            + f"; below agreement {check.min_agreement:g} a trial is wrong_result"
        )
        secs = probe.metric("greedy_s") if probe is not None else None
        if secs is not None:
            return line + f"; {secs:.1f} s in the probe launch"
        if self.config.trial_estimate_s:
            return line + "; counted in trial_estimate_s (--set probe_launch=true measures it)"
        return line + "; not timed (set `trial_estimate_s`, or --set probe_launch=true measures it)"

    @property
    def allow_retry(self) -> bool:
        return self.config.allow_retry

    def _check_flags(self, flags: fl.ServerFlags, report: PreflightReport) -> None:
        where = f"server {flags.version}" if flags.version else "the server"
        checked: list[tuple[str, str, Param | None]] = [(p.flag, f"param `{p.name}`", p) for p in self.flag_params()]
        extra = fl.args_to_dict(list(self.config.extra_args))
        checked += [(name, "settings `extra_args`", None) for name in extra]
        if any(p.type == "buckets" and "none" in str(p.values) for p in self.flag_params()):
            checked.append(("--disable-decode-cuda-graph", "bucket density `none`", None))
        ok = 0
        for flag, who, p in checked:
            spec = flags.get(flag)
            if spec is None:
                hint = flags.suggest(flag)
                report.errors.append(
                    f"{who}: flag {flag} is not accepted by {where}"
                    + (f"; did you mean {hint}?" if hint else "; no similar flag exists")
                )
                continue
            if spec.removed:
                report.errors.append(f"{who}: flag {flag} was removed from {where}: {spec.help[:200]}")
                continue
            if spec.deprecated:
                report.rules.append(
                    f"deprecated: {who} uses {flag}"
                    + (f"; use {spec.new_flag}" if spec.new_flag else f" ({spec.help[:160]})")
                )
            if p is not None:
                if p.type == "bool" and spec.takes_value:
                    report.errors.append(
                        f"{who}: {flag} takes a value, but a bool param becomes a bare switch; make it categorical"
                    )
                    continue
                if p.type != "bool" and not spec.takes_value:
                    report.errors.append(f"{who}: {flag} is a switch without a value; make `{p.name}` a bool")
                    continue
                if p.type == "buckets" and spec.nargs is not None and not spec.is_list:
                    report.errors.append(
                        f"{who}: {flag} takes one value, a bucket set needs a list flag (e.g. --cuda-graph-bs-decode)"
                    )
                    continue
                bad = list(flags.value_errors.get(flag, []))
                for v in fl.candidate_values(p):
                    why = flags.check_value(flag, v)
                    if why and not any(repr(str(v)) in b for b in bad):
                        bad.append(why)
                for why in bad:
                    report.errors.append(f"{who}: {why}")
                if bad:
                    continue
            elif extra.get(flag) and (why := flags.check_value(flag, extra[flag])):
                report.errors.append(f"{who}: {why}")
                continue
            ok += 1
        report.will_run.append(f"{ok} of {len(checked)} flags accepted by {where} ({flags.source})")

    def _rule_ctx(self) -> dict[str, Any]:
        return {
            "gpu_count": self.resolved.hardware.gpu_count,
            "server_flags": self._flags,
            "torch_compile_supported": self.config.torch_compile_supported,
        }

    def _report_rules(self, report: PreflightReport) -> None:
        used = {p.flag for p in self.flag_params()} | set(fl.args_to_dict(list(self.config.extra_args)))
        for rule in fl.RULES:
            if used & set(rule.flags):
                report.rules.append(f"rule `{rule.name}` ({'refuses' if rule.refuse else 'warns'}): {rule.description}")
        args, _ = self.flag_args(self.resolved.defaults())
        for hit in fl.apply_rules(self._all_args(args), self._rule_ctx()):
            line = f"rule `{hit.rule}` fires on the defaults: {hit.message}"
            (report.errors if hit.refuse else report.rules).append(line)

    def _all_args(self, args: list[str]) -> list[str]:
        return list(self.config.extra_args) + args

    # -- before each trial ------------------------------------------------------------------------------------
    def check(self, params: dict[str, Any]) -> str | None:
        reason = super().check(params)
        if reason:
            return reason
        args, env = self.flag_args(params)
        refused = [h for h in fl.apply_rules(self._all_args(args), self._rule_ctx()) if h.refuse]
        if refused:
            return "; ".join(f"rule `{h.rule}`: {h.message}" for h in refused)
        return None

    def gpus_for(self, params: dict[str, Any]) -> int:
        args, _ = self.flag_args(params)
        d = fl.args_to_dict(args)
        tp = d.get("--tp-size") or d.get("--tensor-parallel-size")
        try:
            return int(tp[0]) if tp else (self.config.gpus if self.config.gpus is not None else self.gpus_per_trial)
        except (TypeError, ValueError):
            return self.gpus_per_trial

    # -- export -----------------------------------------------------------------------------------------------
    def launch_spec(self, params: dict[str, Any]) -> LaunchSpec:
        args, env = self.flag_args(params)
        argv = self.server_argv(args, self.config.port)
        return LaunchSpec(
            argv=argv,
            env=self.launch_env(env),
            host=self.host,
            description=f"{self.name} server with {len(args)} tuned flag arguments",
        )

    def kernel_config_dirs(self) -> list[str]:
        return [str(Path(getattr(self.config, k)).expanduser()) for k in DIR_ENVS if getattr(self.config, k)]

    # -- one trial --------------------------------------------------------------------------------------------
    def objective(self) -> Objective:
        obj = self.space.objective
        levels = self.config.levels
        if levels:
            levels = tuple(int(c) for c in levels)
            level = obj.level if obj.level in levels else None
            obj = replace(obj, levels=levels, level=level if obj.combine == "level" else obj.level)
        return obj

    def evaluate(self, params: dict[str, Any], deadline: float, report: Reporter | None = None) -> Measurement:
        t0 = time.time()
        args, param_env = self.flag_args(params)
        env = self.launch_env(param_env)
        low, high = parse_port_range(self.config.port_range)
        port = pick_free_port(low, high, self.host)
        argv = self.trial_argv(args, port)
        cfg = loadgen.LoadConfig.from_settings(self.settings)
        reserve = min(self.config.teardown_reserve_s, 0.2 * max(0.0, deadline - t0))
        work_deadline = deadline - reserve
        server = ServerProcess(
            argv,
            env=env,
            port=port,
            host=self.host,
            health_paths=tuple(self.config.health_paths),
            ready_patterns=tuple(self.config.ready_patterns),
            fatal_grace_s=self.config.fatal_grace_s,
        )
        restore = _kill_server_on_sigterm(server)
        self._trial_gpus = self.gpus_for(params)  # the goodput's per-GPU figures
        self._greedy_result: greedy.CheckResult | None = None
        try:
            m = self._run(server, cfg, t0, work_deadline, report)
            if self._greedy_result is not None:  # handed back for the study's storage (after_trial)
                m.data["greedy"] = self._greedy_doc(self._greedy_result, cfg)
            sig = server.outside_signal()
            if sig is not None and m.outcome is not Outcome.OK:  # a kill from outside says nothing of these flags
                m.metrics.append(MetricRow(OUTSIDE_SIGNAL, "", float(sig), "signal"))
                m.reason += f"; signal {sig} came from outside the tuner: the configuration stays eligible to run again"
        finally:
            stop_t0 = time.time()
            try:
                server.stop(
                    port_timeout_s=max(1.0, deadline - time.time()), gpu_timeout_s=max(1.0, deadline - time.time())
                )
            finally:
                restore()
        m.metrics.append(MetricRow("teardown_s", "", time.time() - stop_t0, "s"))
        m.log = server.log_text()
        m.duration_s = time.time() - t0
        if m.outcome is not Outcome.OK:
            _logger.info("trial %s: %s", m.outcome.value, m.reason)
        return m

    def _run(
        self, server: ServerProcess, cfg: loadgen.LoadConfig, t0: float, deadline: float, report: Reporter | None
    ) -> Measurement:
        ready_deadline = min(deadline, t0 + self.config.ready_timeout_s)
        failure = server.wait_ready(ready_deadline)
        if failure is not None:
            return Measurement.failed(failure.outcome, failure.reason)
        metrics = [MetricRow("startup_s", "", time.time() - t0, "s")]

        def should_abort() -> str | None:
            f = server.failure()
            return f.reason if f else None

        probe = loadgen.probe(server.base_url, cfg, deadline)
        metrics.append(MetricRow("warmup_s", "", probe.warmup_s, "s"))
        # a failed warm-up request is the server's death seen from its socket first: give its exit a moment to show
        f = server.failure_within(DYING_GRACE_S) if probe.broke_off else server.failure()
        if f is not None:  # the server failed during the warm-up: at its first request, or after it
            where = (
                "during the warm-up, at its first request"
                if probe.first is None or not probe.first.ok or probe.warmup_requests <= 1
                else f"during the warm-up, at its request {probe.warmup_requests}"
            )
            return Measurement(f.outcome, reason=f"{where}: {f.reason}", metrics=metrics)
        if probe.refused or (probe.first is not None and not probe.first.ok):
            if probe.refused:  # the load is at fault, not these flags
                return Measurement(Outcome.REQUEST_ERROR, reason=probe.refused, metrics=metrics)
        cfg = probe.config
        # ignore_eos = 1 only when it was sent and the server honoured it (delivered the tokens asked)
        sent = cfg.ignore_eos is not False
        metrics.append(MetricRow("ignore_eos", "", 1.0 if sent and probe.honours_length else 0.0, "flag"))
        metrics.append(MetricRow("length_honoured", "", 1.0 if probe.honours_length else 0.0, "flag"))
        metrics.append(MetricRow("warmup_requests", "", float(probe.warmup_requests), "count"))
        if probe.first is not None and probe.first.count_source:
            metrics.append(MetricRow(f"count:{probe.first.count_source}", "", 1.0, "flag"))
        notes = probe.adapted + ([probe.ignored] if probe.ignored else [])
        metrics += cfg.shape.rows(cfg.seed) if cfg.shape else []  # the load's shape as sent (loadshape.py)
        if self.config.greedy_check is not None:  # once per trial, before the levels (see greedy.py)
            failure = self._greedy(server, cfg, deadline, metrics)
            if failure is not None:
                return failure
        obj = self.objective()
        if obj.is_goodput:  # issue 22: a boundary search under the SLO instead of the levels (goodput.py)
            m = self._goodput(server, cfg, obj, metrics, deadline, should_abort)
            if notes:
                m.data["notes"] = notes
            return m
        by_level: dict[int, float] = {}
        for i, c in enumerate(obj.levels):
            res = loadgen.run_level(
                server.base_url, cfg, c, level_index=i, should_abort=should_abort, deadline=deadline
            )
            if res.aborted:
                f = server.failure()
                if f is not None:
                    return Measurement(f.outcome, reason=f"at c={c}: {f.reason}", metrics=metrics)
                return Measurement(Outcome.TIMEOUT, reason=f"at c={c}: {res.aborted}", metrics=metrics)
            if not res.ok_requests:
                f = server.failure()
                if f is not None:
                    return Measurement(f.outcome, reason=f"at c={c}: {f.reason}", metrics=metrics)
                if res.all_refused:
                    return Measurement(
                        Outcome.REQUEST_ERROR,
                        reason=f"the server refused every request at c={c}: {res.first_error()}",
                        metrics=metrics,
                    )
                return Measurement(
                    Outcome.CRASH, reason=f"every request failed at c={c}: {res.first_error()}", metrics=metrics
                )
            summary = loadgen.level_summary(res)
            metrics += loadgen.level_metrics(res)
            served = loadgen.served_problem(res, self.config.max_error_rate, self.config.min_delivered)
            if served:  # a level that served too little of what was asked is no figure: the trial cannot win
                return Measurement(
                    Outcome.REQUEST_ERROR,
                    reason=f"at c={c}: {served}",
                    metrics=metrics,
                    data={"notes": notes} if notes else {},
                )
            if obj.metric not in summary:
                raise TargetError(f"objective metric {obj.metric!r} is not measured; use one of {sorted(summary)}")
            by_level[c] = summary[obj.metric]
            if report is not None and report(i, by_level[c]):
                return Measurement(Outcome.PRUNED, reason=f"pruned after c={c}", metrics=metrics, by_level=by_level)
        value = obj.combine_values(by_level)
        for lc in obj.constraints:
            got = next((r.value for r in metrics if r.metric == lc.metric and r.level == lc.level), None)
            violation = lc.violation(got) if got is not None and not math.isnan(got) else 1e9
            metrics.append(MetricRow("constraint", constraint_name(lc), float(violation), ""))
        return Measurement(
            Outcome.OK, value=value, metrics=metrics, by_level=by_level, data={"notes": notes} if notes else {}
        )

    # -- the greedy check (greedy.py) ------------------------------------------------------------------------
    def _greedy_key(self, cfg: loadgen.LoadConfig) -> str:
        return greedy.reference_key(self.config.greedy_check, api=cfg.api, model=cfg.model)

    def _greedy(
        self, server: ServerProcess, cfg: loadgen.LoadConfig, deadline: float, metrics: list[MetricRow]
    ) -> Measurement | None:
        """Complete the fixed prompts greedily and judge them against the reference the search passed in; adds the
        rows to ``metrics``; a measurement when the trial ends here (a failed request, or ``wrong_result``)."""
        check = self.config.greedy_check
        t0 = time.time()
        try:
            outs, ids = greedy.complete(
                server.base_url,
                check.prompt_list(),
                api=cfg.api,
                model=cfg.model,
                tokens=check.tokens,
                deadline=deadline,
                timeout_s=cfg.request_timeout_s,
            )
        except greedy.GreedyRequestError as exc:
            f = server.failure()
            if f is not None:
                return Measurement(f.outcome, reason=f"during the greedy check: {f.reason}", metrics=metrics)
            outcome = (
                Outcome.REQUEST_ERROR
                if exc.status is not None and 400 <= exc.status < 500
                else Outcome.TIMEOUT
                if "deadline" in str(exc)
                else Outcome.CRASH
            )
            return Measurement(outcome, reason=f"the greedy check failed: {exc}", metrics=metrics)
        ref_doc = self.config.greedy_reference
        key = self._greedy_key(cfg)
        reference = greedy.completions_of(ref_doc) if ref_doc and ref_doc.get("key") == key else None
        res = greedy.judge(check, outs, reference, is_baseline=self.config.greedy_is_baseline, seconds=time.time() - t0)
        res.token_ids = ids
        self._greedy_result = res
        metrics += res.rows
        _logger.info(
            "greedy check: agreement %.3f over %d prompts (%s, %.1f s)",
            res.agreement,
            len(outs),
            "token ids" if ids else "text",
            res.seconds,
        )
        if res.wrong:
            return Measurement(Outcome.WRONG_RESULT, reason=res.wrong, metrics=metrics)
        return None

    def _greedy_doc(self, res: greedy.CheckResult, cfg: loadgen.LoadConfig) -> dict[str, Any]:
        check = self.config.greedy_check
        return greedy.reference_doc(
            res.completions,
            key=self._greedy_key(cfg),
            trial=None,
            is_baseline=self.config.greedy_is_baseline,
            prompts=check.prompt_list(),
            tokens=check.tokens,
            token_ids=bool(res.token_ids),
        )

    def trial_settings(
        self, repo: Any, run_id: int, *, is_baseline: bool, incumbent: int | None = None
    ) -> dict[str, Any]:
        """With the greedy check on: the stored reference completions, and whether this trial is the baseline. With
        a goodput objective and an ``incumbent`` trial: its stored boundary, the load this trial is checked at
        first (:func:`tuner.targets.server.goodput.incumbent_load`)."""
        out: dict[str, Any] = {}
        if incumbent is not None and self.objective().is_goodput:
            from tuner.targets.server import goodput

            rec = repo.get_trial(run_id, incumbent)
            if rec is not None:
                out.update(goodput.stored_incumbent({(m.metric, m.level): m.value for m in rec.measurements}))
        if self.config.greedy_check is None:
            return out
        cfg = loadgen.LoadConfig.from_settings(self.settings)
        return {
            **out,
            "greedy_reference": greedy.stored_reference(repo, run_id, self._greedy_key(cfg)),
            "greedy_is_baseline": is_baseline,
        }

    def after_trial(
        self, repo: Any, run_id: int, number: int, measurement: Measurement, *, is_baseline: bool
    ) -> Measurement:
        """Keep a trial's completions as the study's reference when none is stored. A trial that became its own
        reference while another worker stored one first is judged again against the stored one."""
        self._say_notes(measurement.data.pop("notes", None) or [])
        doc = measurement.data.pop("greedy", None)
        check = self.config.greedy_check
        if not doc or check is None:
            return measurement
        doc["trial"] = number
        if greedy.store_reference(repo, run_id, doc) or measurement.metric("greedy_reference") is None or is_baseline:
            return measurement
        stored = greedy.stored_reference(repo, run_id, doc["key"])  # another trial's came first
        res = greedy.judge(
            check,
            greedy.completions_of(doc),
            greedy.completions_of(stored),
            is_baseline=False,
            seconds=measurement.metric("greedy_s") or 0.0,
        )
        replaced = {(r.metric, r.level) for r in res.rows} | {("greedy_reference", "")}
        measurement.metrics = [r for r in measurement.metrics if (r.metric, r.level) not in replaced] + res.rows
        _logger.info(
            "trial %d: judged again against trial %s's reference: agreement %.3f",
            number,
            stored.get("trial"),
            res.agreement,
        )
        if res.wrong and measurement.outcome is Outcome.OK:
            measurement.outcome, measurement.value, measurement.reason = Outcome.WRONG_RESULT, None, res.wrong
        return measurement

    def _say_notes(self, notes: list[str]) -> None:
        """What the first requests learnt of the server (a field dropped, no usage, ``ignore_eos`` not honoured):
        said once per search, not once per trial."""
        said = self.__dict__.setdefault("_said", set())
        for note in notes:
            if note not in said:
                said.add(note)
                _logger.warning("the server: %s", note)

    def constraint_names(self) -> list[str]:
        check = self.config.greedy_check
        return [greedy.constraint_name(check)] if check is not None else []

    def _goodput(
        self,
        server: ServerProcess,
        cfg: loadgen.LoadConfig,
        obj: Objective,
        metrics: list[MetricRow],
        deadline: float,
        should_abort,
    ) -> Measurement:
        """The goodput objective: :func:`tuner.targets.server.goodput.run_trial` on this trial's server."""
        from tuner.targets.server import goodput

        gpus = self._trial_gpus
        measure = goodput.Measurer(
            server.base_url,
            cfg,
            self.config,
            make_requests=self.load_requests(cfg),
            deadline=deadline,
            should_abort=should_abort,
        )
        incumbent = goodput.incumbent_load(obj, gpus, self.config)
        m = goodput.run_trial(measure, obj, gpus, metrics, incumbent)
        f = server.failure()
        if f is not None and m.outcome is not Outcome.PRUNED:
            return Measurement(f.outcome, reason=f"during the goodput search: {f.reason}", metrics=m.metrics)
        return m

    def min_trial_s(self) -> float:
        """A goodput trial needs one measurement at least (its window, or its fewest requests at the start rate)
        and its teardown; a levels trial no more than the base's."""
        if not self.objective().is_goodput:
            return 0.0
        from tuner.targets.server import goodput

        return goodput.plan(self.config).measurement_s + self.config.teardown_reserve_s

    def load_requests(self, cfg: loadgen.LoadConfig):
        """``(count, offset) -> requests`` of this trial's load."""
        return lambda count, offset: loadgen.make_requests(cfg, count, offset)


def _kill_server_on_sigterm(server: ServerProcess):
    """While a trial runs in the main thread, SIGTERM (the parent pruning or timing out this trial process) kills
    the server's own process group first, which the parent's group kill would not reach."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum, frame):  # noqa: ARG001
        server.kill_now()
        os._exit(128 + signum)

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # pragma: no cover - not the main interpreter
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, old)
