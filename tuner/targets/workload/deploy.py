"""What a workload (twin) study deploys: the SGLang launch command of its best configuration
(:meth:`tuner.targets.workload.target.WorkloadTarget.deployment`, which the export writes as launch.sh).

The twin's knobs become SGLang 0.5.23 flags and variables through their spaces' ``server:`` annotations
(:mod:`tuner.targets.workload.server_map`). The script is headed by what the twin measured, says that these are
predictions to confirm on the real server, and lists the knobs no flag can set, each with its gain from a stored
ablation (``tuner explain --ablate``) or "none measured". The model path is a variable the user sets. The twin's
own re-measure script is written beside it by the export, and ``tuner verify`` follows launch.sh to it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search_spaces import Space
from tuner.figures.parsimony import NOISE_CAP, Candidate, ParsimonyChoice, prefer_parsimonious
from tuner.targets.base import Deployment
from tuner.targets.workload.presets import get_preset
from tuner.targets.workload.server_map import CommandConfig, ServerLaunch, command_config, server_launch

__all__ = ["CommandConfig", "ServerLaunch", "command_config", "deployment", "server_launch"]

ABLATION_ARTIFACT = "ablation.json"
"""Where ``tuner explain --ablate`` stores its tables, for the export to name each flagless knob's gain."""
PREDICTED = "predicted by the twin: confirm with `tuner verify` or a `--target sglang` search"
MODEL_HINT = "set MODEL to the model path or Hugging Face id, e.g. deepseek-ai/DeepSeek-V4-Flash"
SGLANG_MOE_GLOB = "E=*,N=*,device_name=*.json"
DEFAULT_PORT = 30000


def sglang_argv(space: Space, params: dict[str, Any], launch: ServerLaunch | None = None) -> list[str]:
    """``python -m sglang.launch_server`` with the model path as ``$MODEL`` and the configuration's flags. The tensor
    parallel size is the deployment the preset models (its experts over the local experts of one rank)."""
    launch = launch or server_launch(space, params)
    preset = get_preset(str(space.settings.get("preset") or space.preset))
    tp = max(1, preset.experts_total // preset.experts_local)
    return [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "$MODEL",
        "--trust-remote-code",
        "--tp-size",
        str(tp),
        "--port",
        str(DEFAULT_PORT),
        *launch.args,
    ]


def render_command(
    argv: list[str], *, header: list[str], env: dict[str, str], moe_dir: str | None, record_line: str | None
) -> str:
    """A bash script that runs ``argv``: ``$MODEL`` required, ``$PORT`` optional; values shell-quoted."""
    lines = ["#!/usr/bin/env bash", *[f"# {h}".rstrip() for h in header]]
    if record_line:
        lines.append(record_line)
    lines += [
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f'MODEL="${{MODEL:?{MODEL_HINT}}}"',
        f"PORT=${{PORT:-{DEFAULT_PORT}}}",
    ]
    if moe_dir:
        lines.append(f'export SGLANG_MOE_CONFIG_DIR="$HERE/{moe_dir}"')
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    groups: list[list[str]] = [[]]
    for i, a in enumerate(argv):
        if a.startswith("--") and groups[-1]:
            groups.append([])
        if a == "$MODEL":
            groups[-1].append('"$MODEL"')
        elif i > 0 and argv[i - 1] == "--port":
            groups[-1].append('"$PORT"')
        else:
            groups[-1].append(shlex.quote(a))
    lines.append("exec " + " \\\n    ".join(" ".join(g) for g in groups) + ' \\\n    "$@"')
    return "\n".join(lines) + "\n"


def flagless_lines(launch: ServerLaunch, defaults: dict[str, Any], ablation: dict | None) -> list[str]:
    """One line per knob with no SGLang counterpart: its value, the default, why, and the measured gain."""
    out = []
    rows = {}
    for view, key in (("alone", "gain"), ("undo", "loss")):
        for r in (ablation or {}).get(view, []):
            rows.setdefault(r["param"], []).append((view, key, r))
    for p, value in launch.unmapped:
        head = f"  {p.name}={value}"
        if defaults.get(p.name, p.default) == value:
            out.append(f"{head} (the default; nothing to carry over) - {p.server.none}")
            continue
        gains = []
        for view, key, r in rows.get(p.name, []):
            ratios = r.get(key) or {}
            if ratios:
                text = ", ".join(f"c={c} {float(x):.2f}x" for c, x in sorted(ratios.items(), key=lambda i: int(i[0])))
                gains.append(f"{'alone on the baseline' if view == 'alone' else 'undone from the best'}: {text}")
            else:
                gains.append(f"{view}: {r.get('outcome', 'no result')}")
        gain = "; ".join(gains) if gains else "none measured (`tuner explain --ablate` measures it)"
        # a knob inactive in the default configuration (a tile of a kernel the defaults do not run) has its own default
        default = defaults.get(p.name, p.default)
        was = "no default" if default is None else f"default {default}"
        out.append(f"{head} ({was}): measured gain {gain} - {p.server.none}")
    return out


def carried_lines(launch: ServerLaunch) -> list[str]:
    out = []
    for name, value, args in launch.carried:
        out.append(f"  {name}={value} -> {' '.join(args) if args else 'the server default (no flag)'}")
    return out


def copy_sglang_moe_configs(kernel_dirs: list[Path], dest: Path) -> bool:
    """Copy SGLang-format fused-MoE config files found under ``kernel_dirs`` into ``dest/configs/...`` (SGLang's
    layout for ``SGLANG_MOE_CONFIG_DIR``); ``True`` when any was copied."""
    found = False
    for d in kernel_dirs:
        for f in sorted(d.rglob(SGLANG_MOE_GLOB)):
            rel = f.relative_to(d)
            rel = rel if rel.parts[0] == "configs" else Path("configs") / rel
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest / rel)
            found = True
    return found


def _no_moe_configs(kernel_dirs: list[Path], dest: Path) -> bool:
    """The export's MoE-config copy where the command's path reads none: nothing copied, no SGLANG_MOE_CONFIG_DIR."""
    return False


def read_ablation(repo, run_id: int) -> dict | None:
    art = repo.get_artifact(run_id, ABLATION_ARTIFACT)
    if art is None:
        return None
    try:
        return json.loads(art.content)
    except (ValueError, TypeError):
        return None


_PARSER_CHECK = """
import argparse, json, sys
argv = sys.argv[1:]
if argv[:2] != ["-m", "sglang.launch_server"]:
    sys.exit(f"not an SGLang launch: {argv[:2]}")
import sglang
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
ns = parser.parse_args(argv[2:])
out = {k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, list, type(None)))}
print(json.dumps({"sglang": getattr(sglang, "__version__", None), "args": out}))
"""


def parse_launch_script(
    script: str | os.PathLike,
    *,
    env: dict[str, str] | None = None,
    python: str = sys.executable,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Run an exported launch.sh with ``python`` on its PATH replaced by a checker that hands the exact argv bash
    built to SGLang's own parser (``ServerArgs.add_cli_args``, unmodified) and returns the parsed values (``env`` is
    added to the script's environment; ``MODEL`` defaults to a placeholder):
    ``{"sglang": version, "args": {...}}``. Nothing is launched. ``ValueError`` with the parser's message when it
    refuses the command."""
    with tempfile.TemporaryDirectory(prefix="tuner-parse-") as d:
        shim = Path(d)
        (shim / "check.py").write_text(_PARSER_CHECK)
        (shim / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(python)} "{shim / "check.py"}" "$@"\n')
        os.chmod(shim / "python", 0o755)
        full = {
            **os.environ,
            "MODEL": "MODEL_PATH",
            **(env or {}),
            "PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=timeout_s, env=full)
    if done.returncode != 0:
        tail = [ln for ln in done.stderr.splitlines() if ln.strip()][-1:] or ["no output"]
        raise ValueError(f"SGLang's parser refused {script}: {tail[0]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass
class ReleaseCheck:
    """The command built for one SGLang release: ``line`` says which release checked it, ``moved`` has one line per
    knob that release cannot set (taken out of the command)."""

    line: str
    moved: list[str] = field(default_factory=list)


def for_installed_release(launch: ServerLaunch, flags=None) -> ReleaseCheck:
    """Rewrite ``launch`` (in place) for the installed SGLang's parser (``flags``: a ``ServerFlags``; read with
    ``introspect_parser`` when None): a flag that release knows under another name (its row of
    ``RELEASE_RENAMES``) is written under that name; a knob whose flag it does not know is taken out of the command,
    with one line saying so. Where no SGLang is installed, the command stays as written for ``SPACE_RELEASE``."""
    from tuner.errors import FlagsUnavailable
    from tuner.targets.server.flags import SPACE_RELEASE, introspect_parser, name_in_release

    if flags is None:
        try:
            flags = introspect_parser()
        except FlagsUnavailable:
            return ReleaseCheck(
                f"flags checked against SGLang {SPACE_RELEASE} (the release the space is written for); "
                "no SGLang is installed here to check them"
            )
    release = flags.version or "?"
    out = ReleaseCheck(f"flags checked by the installed SGLang {release}'s own parser")
    args: list[str] = []
    carried = []
    for name, value, kargs in launch.carried:
        if not kargs or not kargs[0].startswith("--"):
            args += kargs
            carried.append((name, value, kargs))
            continue
        new = list(kargs)
        missing = []
        for i, a in enumerate(kargs):
            if a.startswith("--"):
                known = name_in_release(a, flags)
                if known is None:
                    missing.append(a)
                else:
                    new[i] = known
        if missing:
            out.moved.append(
                f"  {name}={value}: SGLang {release} has no flag {', '.join(missing)}; moved under the "
                "code changes (this command leaves the server's default)"
            )
            carried.append((name, value, []))
            continue
        args += new
        carried.append((name, value, new))
    leftover = [a for a in launch.args if a not in {x for _, _, k in launch.carried for x in k}]
    launch.args[:] = args + leftover
    launch.carried[:] = carried
    return out


@dataclass(frozen=True)
class StagedCommand:
    """The command stage's best as :func:`command_stage_best` chose it: its first run's trial number and parameters,
    and the parsimony choice that picked it."""

    number: int
    params: dict[str, Any]
    parsimony: ParsimonyChoice


def command_stage_best(
    repo, run_id: int, maximize: bool, space: Space, arch: str | None, projected: CommandConfig
) -> StagedCommand | None:
    """The search's best configuration the command can give as it is (``command_config`` changes nothing: the
    command stage's best, ``tuner.search.stages``), when it beats the median of ``projected`` (the best's own
    configuration with its code changes taken out) or ``projected`` was never measured; else ``None``. "Best" is
    parsimonious (``tuner.figures.parsimony``): among the deployable configurations within the measured noise of
    the best median, the one with the fewest changes from the baseline (on a GPU the deployment map covers, SGLang's
    own defaults), so that a flag which measured no gain (a context cap on Hopper) is not exported."""
    if not projected.changes:
        return None
    groups: dict[str, list] = {}
    for t in repo.list_trials(run_id, outcome="ok"):
        if t.value is not None and t.repeat_of is None:
            groups.setdefault(json.dumps(t.params, sort_keys=True, default=str), []).append(t)
    deployable = {key: runs for key, runs in groups.items() if not command_config(space, runs[0].params, arch).changes}
    if not deployable:
        return None
    baseline = repo.baseline_trial(run_id)
    defaults = dict(baseline.params) if baseline is not None else space.defaults()
    medians = {key: statistics.median(r.value for r in runs) for key, runs in deployable.items()}
    spreads = [
        (max(r.value for r in runs) - min(r.value for r in runs)) / medians[key]
        for key, runs in deployable.items()
        if len(runs) > 1 and medians[key]
    ]
    noise = min(NOISE_CAP, max(spreads, default=0.0))
    choice = prefer_parsimonious(
        [Candidate(key, runs[0].params, medians[key]) for key, runs in deployable.items()],
        defaults,
        noise,
        maximize=maximize,
    )
    key = json.dumps(projected.params, sort_keys=True, default=str)
    if choice.chosen.key == key:  # the best's own values as a command are the (parsimonious) command stage's best
        return None
    mine = groups.get(key)
    sign = 1.0 if maximize else -1.0
    if mine and sign * statistics.median(r.value for r in mine) >= sign * choice.chosen.value:
        return None
    first = deployable[choice.chosen.key][0]
    return StagedCommand(first.number, dict(first.params), choice)


def deployment(
    space: Space,
    params: dict[str, Any],
    arch: str | None,
    ablation: dict | None,
    *,
    staged: StagedCommand | None = None,
) -> Deployment:
    """The SGLang command for the twin configuration ``params`` on a GPU of architecture ``arch``: every value it
    cannot give replaced (:func:`command_config`), its flags checked by the installed SGLang's parser, the knobs
    without a flag with their gains from ``ablation`` (``tuner explain --ablate``'s stored tables). ``staged``: the
    command stage's best (:func:`command_stage_best`), which the command then runs instead."""
    cmd = command_config(space, params, arch)
    if staged is not None:  # the command stage's best measured better than the best's own values as a command
        cmd = CommandConfig(params=dict(staged.params), changes=cmd.changes)
    launch = server_launch(space, cmd.params)
    release = for_installed_release(launch)
    argv = sglang_argv(space, cmd.params, launch)
    lines = [release.line]
    if staged is not None:
        choice = staged.parsimony
        within = (
            f"; the fewest changes from the baseline among the commands within the measured noise "
            f"({choice.noise:.1%}) of the best command measured"
            if choice.switched
            else ""
        )
        lines.append(
            f"this command is the command stage's best (trial {staged.number}, only values the command can "
            f"set), measured better than the twin's best with its code changes taken out{within}"
        )
    mapped = space.deployment is not None and space.deployment.covers(arch)
    copy_configs = copy_sglang_moe_configs
    if mapped:
        lines += [
            f"what this command's configuration ran for each component {space.deployment.release} runs on "
            f"{arch} (sources: files of that release):",
            *space.deployment.fidelity_lines(arch, cmd.params),
        ]
        reads = space.deployment.reads_lines(arch, cmd.params)
        if reads:
            lines += ["the tuned files SGLang reads on this command's paths:", *reads]
        if "SGLANG_MOE_CONFIG_DIR" not in space.deployment.reads_env(arch, cmd.params):
            copy_configs = _no_moe_configs  # SGLang reads them on a path this command does not take
            lines.append(
                "  fused-MoE Triton configs (SGLANG_MOE_CONFIG_DIR): not shipped, whatever was tuned; this command's "
                "routed experts do not read them"
            )
    lines += ["this command (twin knob=value -> SGLang):", *carried_lines(launch)]
    lines += [
        f"  {p.name}={v}: what SGLang's own code runs ({p.server.none})"
        for p, v in launch.unmapped
        if p.server and p.server.deployed_value(arch) == v
    ]
    lines += flagless_lines(
        ServerLaunch(
            unmapped=[(p, v) for p, v in launch.unmapped if not (p.server and p.server.deployed_value(arch) == v)]
        ),
        space.defaults(),
        ablation,
    )
    lines += [
        "with these code changes (the twin's best; this command cannot give them):",
        *(cmd.lines() + release.moved or ["  none"]),
    ]

    def render(header: list[str], record_line: str, config_dir: str | None) -> str:
        return render_command(argv, header=header, env=launch.env, moe_dir=config_dir, record_line=record_line)

    return Deployment(
        params=cmd.params,
        same=not cmd.changes and not release.moved,
        title="SGLang launch command",
        predicted=PREDICTED,
        by="the twin",
        lines=lines,
        predictions="the twin's predictions (its decode step on random weights; x "
        + (
            f"the baseline, SGLang's default path on {arch} as the twin ran it"
            if mapped
            else "the space's default configuration"
        )
        + ", tok/s):",
        render=render,
        copy_configs=copy_configs,
        footer=["random weights as the twin: add --load-format dummy; MODEL=path-or-id PORT=n bash launch.sh [flags]"],
    )
