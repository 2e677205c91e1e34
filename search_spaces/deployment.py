"""A deployment map: what the pinned serving release runs for each component of the twin's decode step, per GPU
architecture and per flag or variable that changes it, with the source line each claim was read from.

A space names its map (``deployment: sglang-0.5.23-dsv4``, a file in ``search_spaces/deployments/``). On a GPU whose
architecture the map covers, the baseline (trial 0) runs the deployment's own path: the ``twin`` values of the runs
marked ``default``, each where this machine can run it (:func:`search_spaces.resolve.resolve`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from search_spaces.schema import SpaceError

DEPLOYMENTS_DIR = Path(__file__).resolve().parent / "deployments"
FIDELITIES = ("kernel", "stand_in")
"""``kernel``: the twin runs the deployment's own kernel; ``stand_in``: a kernel of the twin's in its place."""


@dataclass(frozen=True)
class Source:
    """Where a claim was read: a file of the release's package, a line, and a text that stands on (or by) it."""

    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Run:
    """One kernel the release runs for a component on some architectures: by default, or ``selected_by`` a flag or
    variable; ``twin`` the knob values that run it (or its stand-in) in the twin, None where the twin cannot;
    ``fallback`` the knob values of a labelled stand-in (``stand_in`` says which) the baseline runs where ``twin``'s
    cannot run on this machine (SGLang's JIT kernels without nvcc, say)."""

    component: str
    arch: tuple[str, ...]
    kernel: str
    source: Source
    default: bool = False
    selected_by: str = ""
    twin: dict[str, Any] | None = None
    fidelity: str = ""
    stand_in: str = ""
    fallback: dict[str, Any] | None = None
    reads: str = ""
    """The tuned files the release reads on this path (where, and whether an export can ship them); empty: unknown."""
    reads_env: str = ""
    """The environment variable that points the release at a folder of those files (``SGLANG_MOE_CONFIG_DIR``), where
    one does: the export ships the files tuned for this path there; empty where none does."""

    def describe(self) -> str:
        how = "default" if self.default else self.selected_by
        what = (
            "the twin has no counterpart"
            if self.twin is None
            else ", ".join(f"{k}={v}" for k, v in self.twin.items())
            + (" (the deployment's kernel)" if self.fidelity == "kernel" else f" (stand-in: {self.stand_in})")
        )
        return f"{self.component} [{how}]: {self.kernel} [{self.source}] -> twin {what}"


@dataclass(frozen=True)
class Deployment:
    name: str
    release: str
    model: str
    runs: tuple[Run, ...]

    def on(self, arch: str | None) -> tuple[Run, ...]:
        """The runs of a GPU architecture (none for a CPU or an architecture the map does not cover)."""
        return tuple(r for r in self.runs if arch and arch in r.arch)

    def covers(self, arch: str | None) -> bool:
        return bool(self.on(arch))

    def baseline(self, arch: str | None) -> dict[str, Any]:
        """The twin's knob values for the release's default path on ``arch`` ({} where the map does not cover it)."""
        out: dict[str, Any] = {}
        for r in self.on(arch):
            if r.default and r.twin:
                out.update(r.twin)
        return out

    def default_runs(self, arch: str | None) -> tuple[Run, ...]:
        return tuple(r for r in self.on(arch) if r.default)

    def ran(self, arch: str | None, params: dict[str, Any]) -> list[tuple[Run, Run | None]]:
        """Per component of the release's default path on ``arch``: its default run, and the run of that component
        ``params`` ran (the default, or one a flag selects, matched by its twin values or its fallback's; None where
        ``params`` ran none of the release's kernels for it)."""
        out = []
        for d in self.default_runs(arch):
            match = None
            for r in sorted((r for r in self.on(arch) if r.component == d.component), key=lambda r: not r.default):
                if r.twin is None:
                    continue
                ran = {k: params.get(k) for k in r.twin}
                if ran == r.twin or (r.fallback is not None and ran == r.fallback):
                    match = r
                    break
            out.append((d, match))
        return out

    def fidelity_lines(self, arch: str | None, params: dict[str, Any]) -> list[str]:
        """One line per component of the release's default path on ``arch``: whether a configuration (``params``)
        ran the release's own kernel for it (the default's, or the one a flag selects), a stand-in (which), or none
        of the two (what it ran instead)."""
        out = []
        for d, r in self.ran(arch, params):
            if d.twin is None:
                out.append(f"  {d.component}: {d.kernel}: no counterpart in the twin [{d.source}]")
                continue
            if r is None:
                values = ", ".join(f"{k}={params.get(k)}" for k in d.twin)
                out.append(f"  {d.component}: the twin ran {values} (not SGLang's {d.kernel}) [{d.source}]")
                continue
            picked = "" if r.default else f" ({r.selected_by})"
            ran = {k: params.get(k) for k in r.twin}
            if r.fidelity == "kernel" and ran == r.twin:
                out.append(f"  {r.component}: SGLang's own kernel{picked}, {r.kernel} [{r.source}]")
            else:
                out.append(f"  {r.component}: a stand-in for {r.kernel}{picked}: {r.stand_in} [{r.source}]")
        return out

    def reads_lines(self, arch: str | None, params: dict[str, Any]) -> list[str]:
        """One line per component ``params`` ran a release path of whose tuned files the map records."""
        return [f"  {r.component}: {r.reads}" for _, r in self.ran(arch, params) if r is not None and r.reads]

    def reads_env(self, arch: str | None, params: dict[str, Any]) -> set[str]:
        """The environment variables through which the paths ``params`` ran read tuned files from a folder."""
        return {r.reads_env for _, r in self.ran(arch, params) if r is not None and r.reads_env}


def _fail(where: str, what: str, value: Any, fix: str) -> SpaceError:
    return SpaceError(f"{where}: {what} (got {value!r}); {fix}")


def load_deployment(name: str, where: str = "deployment") -> Deployment:
    """The map ``search_spaces/deployments/<name>.yaml``, validated; a bad one is one :class:`SpaceError` line."""
    path = DEPLOYMENTS_DIR / f"{name}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in DEPLOYMENTS_DIR.glob("*.yaml"))
        raise _fail(where, "unknown deployment map", name, f"use one of {known}")
    data = yaml.safe_load(path.read_text())
    src = str(path.name)
    if not isinstance(data, dict) or not isinstance(data.get("components"), dict):
        raise _fail(
            src,
            "a deployment map needs `release` and `components`",
            type(data).__name__,
            "see search_spaces/deployments/sglang-0.5.23-dsv4.yaml",
        )
    runs: list[Run] = []
    for comp, entries in data["components"].items():
        for i, e in enumerate(entries or []):
            at = f"{src}: components.{comp}[{i}]"
            if not isinstance(e, dict):
                raise _fail(at, "must be a mapping", e, "write `{arch: [sm_90], kernel: ..., source: {...}}`")
            unknown = set(e) - {
                "arch",
                "default",
                "selected_by",
                "kernel",
                "source",
                "twin",
                "fidelity",
                "stand_in",
                "fallback",
                "reads",
                "reads_env",
            }
            if unknown:
                raise _fail(
                    at,
                    "unknown key",
                    sorted(unknown)[0],
                    "use arch, default, selected_by, kernel, source, twin, fidelity, stand_in, fallback, reads, reads_env",
                )
            arch = e.get("arch")
            if not isinstance(arch, list) or not arch or not all(isinstance(a, str) for a in arch):
                raise _fail(at, "`arch` must be a list of GPU architectures", arch, "write `arch: [sm_90]`")
            s = e.get("source")
            if not (
                isinstance(s, dict)
                and isinstance(s.get("file"), str)
                and isinstance(s.get("line"), int)
                and isinstance(s.get("text"), str)
                and s["text"]
            ):
                raise _fail(
                    at,
                    "`source` must be {file, line, text}",
                    s,
                    "write `source: {file: srt/..., line: 880, text: <what stands on that line>}`",
                )
            if bool(e.get("default")) == bool(e.get("selected_by")):
                raise _fail(
                    at,
                    "a run is either `default: true` or `selected_by` a flag or variable",
                    {k: e.get(k) for k in ("default", "selected_by")},
                    "set exactly one of them",
                )
            twin = e.get("twin")
            fidelity = e.get("fidelity", "")
            if twin is not None and (not isinstance(twin, dict) or fidelity not in FIDELITIES):
                raise _fail(
                    at,
                    "`twin` must be knob values with `fidelity` kernel or stand_in",
                    (twin, fidelity),
                    "write `twin: {indexer_impl: deepgemm}` and `fidelity: kernel`",
                )
            fallback = e.get("fallback")
            if fallback is not None and (not isinstance(fallback, dict) or not twin or set(fallback) != set(twin)):
                raise _fail(
                    at,
                    "`fallback` must be values of the same knobs as `twin`",
                    fallback,
                    "write `fallback: {glue: fused}` beside `twin: {glue: sglang}`",
                )
            if (fidelity == "stand_in" or fallback is not None) and not str(e.get("stand_in", "")).strip():
                raise _fail(
                    at,
                    "a stand-in must say what the twin runs instead and what is known of the gap",
                    e.get("stand_in"),
                    "add `stand_in: ...`",
                )
            runs.append(
                Run(
                    component=str(comp),
                    arch=tuple(arch),
                    kernel=" ".join(str(e.get("kernel", "")).split()),
                    source=Source(s["file"], s["line"], s["text"]),
                    default=bool(e.get("default")),
                    selected_by=str(e.get("selected_by") or ""),
                    twin=dict(twin) if twin else None,
                    fidelity=fidelity,
                    stand_in=" ".join(str(e.get("stand_in", "")).split()),
                    fallback=dict(fallback) if fallback else None,
                    reads=" ".join(str(e.get("reads", "")).split()),
                    reads_env=str(e.get("reads_env") or ""),
                )
            )
    return Deployment(
        name=name, release=str(data.get("release", "")), model=str(data.get("model", "")), runs=tuple(runs)
    )
