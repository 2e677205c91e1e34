"""SGLang's own server as a target: ``python -m sglang.launch_server`` started per trial from flags its own parser
checks (the generic machinery is :class:`tuner.targets.server.target.CommandTarget`'s; this module holds what is
SGLang's: its launch command, its parser, its release's flag names and its tuned-config folders)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from tuner.errors import TargetError
from tuner.targets.base import PreflightReport
from tuner.targets.server import flags as fl
from tuner.targets.server.target import CommandTarget

_logger = logging.getLogger(__name__)


class SGLangTarget(CommandTarget):
    name = "sglang"
    gpus_per_trial = 1
    model_path_checked = False  # the built-in spaces name the GPU machine's path: a dry-run elsewhere still plans

    @property
    def python(self) -> str:
        return self.config.python or sys.executable

    def _check_model(self) -> None:
        if not self.model:
            raise TargetError(
                "target `sglang` needs setting `model` (a model path or hub name); pass --model PATH "
                "or --set model=PATH"
            )

    def base_command(self, port: int | str) -> list[str]:
        if not self.model:
            raise TargetError(
                "target `sglang` needs settings `model` (a model path or hub name); "
                "pass --model PATH or --set model=PATH"
            )
        return [
            self.python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            self.model,
            "--host",
            self.host,
            "--port",
            str(port),
        ]

    def help_command(self) -> list[str]:
        return [self.python, "-m", "sglang.launch_server", "--help"]

    def trial_argv(self, args: list[str], port: int | str) -> list[str]:
        """A trial's launch: with ``load_format`` (e.g. ``dummy``) it runs on weights of the right shapes that are
        never read from disk; the export (:meth:`launch_spec`) keeps the real ones."""
        fmt = ["--load-format", self.config.load_format] if self.config.load_format else []
        return self.server_argv(args, port) + fmt

    def _check_flags(self, flags: fl.ServerFlags, report: PreflightReport) -> None:
        super()._check_flags(flags, report)
        fmt = self.config.load_format
        if fmt:
            why = (
                "--load-format is not accepted by this server"
                if flags.get("--load-format") is None
                else flags.check_value("--load-format", fmt)
            )
            if why:
                report.errors.append(f"setting `load_format`: {why}")
            else:
                report.will_run.append(f"trials load `--load-format {fmt}` weights; the export keeps the real ones")
                if fmt == "dummy" and self.config.greedy_check is not None:
                    report.rules.append(
                        "greedy check on `--load-format dummy` weights: SGLang's seeded random "
                        "weights (+-1e-3) give near-flat logits, so greedy completions hang on "
                        "near-ties; an agreement under 1.0 may be noise there (check with the "
                        "real weights)"
                    )

    def load_flags(self, checks: list[tuple[str, list[Any]]]) -> fl.ServerFlags | None:
        parser = self.config.parser or fl.SGLANG_PARSER
        try:
            return fl.introspect_parser(self.python, parser, checks)
        except fl.FlagsUnavailable as exc:
            _logger.info("parser introspection failed (%s); falling back to --help", exc)
            return fl.help_flags(self.help_command())

    def launch_command(self) -> list[str]:
        return [self.python, "sglang", self.model]

    def server_version(self) -> str:
        if self._flags and self._flags.version:
            return self._flags.version
        if self.python == sys.executable:
            from importlib.metadata import PackageNotFoundError, version

            try:
                return version("sglang")
            except PackageNotFoundError:
                return ""
        return ""

    # -- the kernel phase: SGLang's own fused-MoE kernel at the shapes this space's launches run ------------------
    def _flag_values(self, flags: tuple[str, ...], default: int) -> list[int]:
        """The values a launch can give the first of ``flags`` that is set: a parameter's (pinned) choices, a fixed
        ``extra_args`` value, else ``default`` (the server's)."""
        searched = {p.name for p in self.resolved.params}
        for p in self.space.params:
            if p.flag in flags:
                if p.name in self.resolved.fixed:
                    return [int(self.resolved.fixed[p.name])]
                if p.name in searched:  # a dropped one (its requirement fails here) is never passed
                    return sorted({int(v) for v in p.choices() if str(v).isdigit()}) or [default]
        extra = list(self.config.extra_args)
        for i, a in enumerate(extra):
            name, _, value = a.partition("=")
            if name in flags:
                try:
                    return [int(value or extra[i + 1])]
                except (IndexError, ValueError):
                    raise TargetError(
                        f"setting `extra_args` gives {name} without an integer after it "
                        f"({extra[i : i + 2]}); write e.g. {name} 8"
                    ) from None
        return [default]

    def kernel_shapes(self) -> list[tuple[str, dict[str, int]]]:
        """SGLang's fused-MoE kernel at every shape this space's launches give it: one case per decode batch (each
        objective level, and as padded to each CUDA-graph bucket it can take) and per tensor/expert-parallel split
        of the routed experts (``E = experts / ep``, ``N = width / (tp / ep)``). Needs setting ``moe``
        (``{hidden, width, experts, topk}``); without it there is nothing to tune."""
        moe = self.config.moe
        if not moe:
            return []
        try:
            hidden, width, experts, topk = (int(moe[k]) for k in ("hidden", "width", "experts", "topk"))
        except (KeyError, TypeError, ValueError):
            raise TargetError(
                f"setting `moe` must map hidden, width, experts and topk to integers, but got {moe!r}; "
                "e.g. {hidden: 4096, width: 2048, experts: 256, topk: 6}"
            ) from None
        from search_spaces.buckets import level_batches

        batches = level_batches(self.space)
        splits = []
        for tp in self._flag_values(("--tp-size", "--tensor-parallel-size"), 1):
            for ep in self._flag_values(("--ep-size", "--expert-parallel-size"), 1):
                if tp % ep == 0 and experts % ep == 0 and width % (tp // ep) == 0:
                    splits.append((experts // ep, width // (tp // ep)))
        return [
            ("sglang_fused_moe", {"tokens": b, "hidden": hidden, "width": n, "experts": e, "topk": topk})
            for b in batches
            for e, n in dict.fromkeys(splits)
        ]

    def use_kernel_configs(self, config_dir: str) -> dict[str, str]:
        """The settings that launch every later trial (and the export) with the SGLang MoE files a kernel phase
        wrote to ``config_dir``; none when ``moe_config_dir`` is already set or no such file was written."""
        from kernels.plugins.sglang_moe import SGLANG_MOE_SUBDIR

        moe_dir = Path(config_dir) / SGLANG_MOE_SUBDIR
        if self.config.moe_config_dir or not moe_dir.is_dir():
            return {}
        _logger.info("trials launch SGLang with SGLANG_MOE_CONFIG_DIR=%s", moe_dir)
        return {"moe_config_dir": str(moe_dir)}
