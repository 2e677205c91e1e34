"""The SGLang plug-in in an export: only the kernels measured faster than SGLang's own, per batch bucket.

A **side-by-side record** (:class:`SideBySide`) is one measurement of one of our kernels beside the SGLang function
it would replace, on SGLang's argument layout: hook target, batch, shape and dtypes, our median and SGLang's (us),
our output's relative norm error against SGLang's, the GPU, date and commit. ``benchmarks/sglang_plugin_kernels.py``
makes them on a GPU and :func:`store_records` keeps them in the study's storage (artifacts of kind
``side_by_side``). :func:`choose` keeps a bucket where ours was faster beyond the noise (:meth:`SideBySide.beyond_noise`) with
numerics within :data:`TOLERANCE` beside SGLang's own kernel (not a torch stand-in), and says why each other record was left out. :func:`write_plugin`
writes ``sglang_plugin/``: a pip-installable package (entry point in ``sglang.srt.plugins``), the kernel files it
needs, their configs, ``MANIFEST.json`` and one AROUND hook per replaced function (``sglang_plugin_files/``, copied
as they are). With nothing chosen it writes nothing; :attr:`Plugin.lines` is what launch.sh's header says either way.

The interface to the rest of the export is :func:`export_plugin` (records of a study in, lines out).

The prediction "with this plug-in" is the twin's: ``tuner.export.script`` writes ``remeasure_plugin.sh`` (the exported
command's configuration with this package loaded into the twin as SGLang loads it,
``tuner.targets.workload.sglang_plugin``) and measures it once where the search's GPU is; ``tuner verify`` re-runs it.
The records themselves come from the search (``tuner.search.driver``'s plug-in phase, which runs
``tuner.export.sglang_plugin_measure`` after the trials) or from ``benchmarks/sglang_plugin_kernels.py --store``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner import __version__

DIR = "sglang_plugin"
DIST = "tuner-sglang-plugin"
ENTRY = "tuner_kernels"
"""The entry point's name: what ``SGLANG_PLUGINS`` lists."""
PACKAGE = "tuner_sglang_plugin"
DISABLE_ENV = "TUNER_PLUGIN_DISABLE"
ARTIFACT_KIND = "side_by_side"
TOLERANCE = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-5}
MIN_GAIN = 0.05
"""For a record without repeat rounds: ours must be this much faster than SGLang's median (two medians of a ~5-us
kernel timed once each, ours the best of several configs, say little more)."""
"""Relative norm error of our output against SGLang's kernel's, per input dtype, within which a kernel may ship."""


@dataclass(frozen=True)
class HookSpec:
    """A function the plug-in can replace: the hook factory in ``sglang_plugin_files/hooks.py``, SGLang's argument
    names (checked at load), the kernel file it ships (under ``kernels/``) and the config file it reads."""

    hook: str
    args: tuple[str, ...]
    kernel_file: str
    config_file: str


HOOKS = {
    "sglang.kernels.ops.attention.dsv4.norm_rope.fused_q_norm_rope": HookSpec(
        "fused_q_norm_rope",
        ("q_input", "q_output", "eps", "freqs_cis", "positions"),
        "sglang_q_norm_rope.py",
        "configs/q_norm_rope.json",
    ),
}


@dataclass(frozen=True)
class SideBySide:
    """One side-by-side measurement. ``shape``: ``heads, head_dim, rope_dim, norm`` for the q path; ``dtypes``:
    ``dtype`` (input) and ``out_dtype``; ``baseline``: ``sglang`` (SGLang's own kernel) or ``torch`` (a torch
    implementation of the same semantics, where SGLang's kernel could not be built); ``config``: our kernel's."""

    target: str
    batch: int
    shape: dict[str, Any]
    dtypes: dict[str, str]
    ours_us: float
    sglang_us: float
    rel_err: float
    gpu: str
    arch: str
    date: str
    commit: str
    sglang: str
    baseline: str = "sglang"
    config: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    ours_rounds_us: list[float] = field(default_factory=list)
    sglang_rounds_us: list[float] = field(default_factory=list)
    """Medians of the two kernels timed in alternating rounds after ours was chosen (empty in older records)."""

    def beyond_noise(self) -> bool:
        """Ours faster than SGLang's beyond the noise: slower than SGLang's in no round of the alternating repeats
        (every round of ours under every round of SGLang's); without rounds, by :data:`MIN_GAIN` over the medians."""
        if self.ours_rounds_us and self.sglang_rounds_us:
            return max(self.ours_rounds_us) < min(self.sglang_rounds_us)
        return self.ours_us * (1 + MIN_GAIN) < self.sglang_us

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SideBySide:
        names = {f.name for f in dataclasses.fields(cls)}
        optional = ("baseline", "config", "source", "ours_rounds_us", "sglang_rounds_us")
        missing = sorted(n for n in names - set(d) if n not in optional)
        if missing:
            raise ValueError(f"side-by-side record lacks {', '.join(missing)}: {json.dumps(d)[:200]}")
        return cls(**{k: v for k, v in d.items() if k in names})

    def case(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "dtype": self.dtypes["dtype"],
            "out_dtype": self.dtypes["out_dtype"],
            **{k: self.shape[k] for k in ("heads", "head_dim", "rope_dim", "norm")},
        }

    def figures(self) -> str:
        rounds = (
            f" (rounds: ours {min(self.ours_rounds_us):.2f}-{max(self.ours_rounds_us):.2f}, theirs "
            f"{min(self.sglang_rounds_us):.2f}-{max(self.sglang_rounds_us):.2f} us)"
            if self.ours_rounds_us and self.sglang_rounds_us
            else ""
        )
        return (
            f"ours {self.ours_us:.2f} us vs {'SGLang' if self.baseline == 'sglang' else 'torch'} "
            f"{self.sglang_us:.2f} us{rounds}, rel err {self.rel_err:.2g}"
        )


def store_records(repo, study: str, records: list[SideBySide], name: str) -> None:
    """Keep ``records`` in ``study``'s storage as one artifact (``side_by_side/<name>.json``; the same name again
    replaces it)."""
    run = repo.get_run(study)
    if run is None:
        raise ValueError(f"no study {study!r} in this storage; `tuner status` lists the studies")
    body = json.dumps({"records": [dataclasses.asdict(r) for r in records]}, indent=1, sort_keys=True)
    repo.add_artifacts(run.id, [(ARTIFACT_KIND, f"{ARTIFACT_KIND}/{name}.json", name, body.encode())])


def read_records(repo, run_id: int) -> list[SideBySide]:
    out = []
    for a in repo.list_artifacts(run_id):
        if a.kind == ARTIFACT_KIND:
            out += [
                SideBySide.from_dict(dict(d, source=d.get("source") or a.name))
                for d in json.loads(a.content)["records"]
            ]
    return out


@dataclass
class Choice:
    shipped: list[SideBySide]
    left_out: list[tuple[SideBySide, str]]


def choose(records: list[SideBySide], *, gpu: str | None = None) -> Choice:
    """Which records ship: SGLang's kernel beside ours, a hook this tuner has, numerics within tolerance, ours
    faster, on the deployment's GPU (``gpu``, the study's, where it names one). The newest record per (target,
    case, batch) counts; the older ones are left out as superseded."""
    newest: dict[tuple, SideBySide] = {}
    left: list[tuple[SideBySide, str]] = []
    for r in sorted(records, key=lambda r: r.date):
        key = (r.target, json.dumps(r.case(), sort_keys=True), r.batch)
        if key in newest:
            left.append((newest[key], f"superseded by the record of {r.date}"))
        newest[key] = r
    shipped = []
    for r in newest.values():
        tol = TOLERANCE.get(r.dtypes.get("dtype", ""), None)
        if r.target not in HOOKS:
            why = "this tuner has no hook for that target"
        elif r.baseline != "sglang":
            why = f"timed beside a {r.baseline} implementation of the same semantics, not SGLang's kernel"
        elif tol is None:
            why = f"no tolerance for dtype {r.dtypes.get('dtype')!r}"
        elif not (math.isfinite(r.rel_err) and r.rel_err <= tol):
            why = f"numerics: rel err {r.rel_err:.2g} against SGLang's output > {tol:g}"
        elif not r.ours_us < r.sglang_us:
            why = f"not faster: {r.figures()}"
        elif not r.beyond_noise():
            how = "slower in a round of the alternating repeats" if r.ours_rounds_us else f"under {MIN_GAIN:.0%}"
            why = f"not faster beyond the noise ({how}): {r.figures()}"
        elif gpu and r.gpu != gpu:
            why = f"measured on {r.gpu}, the study's GPU is {gpu}"
        else:
            shipped.append(r)
            continue
        left.append((r, why))
    return Choice(shipped, left)


@dataclass
class Plugin:
    """What :func:`export_plugin` did: ``path`` (None when no plug-in was written), ``manifest``, and the lines
    for launch.sh's header."""

    path: Path | None
    manifest: dict[str, Any] | None
    lines: list[str]


def _version(study: str, commit: str | None) -> str:
    label = re.sub(r"[^a-z0-9]+", ".", study.lower()).strip(".") or "study"
    return f"{__version__}+{label}.g{(commit or 'unknown')[:12].replace('-', '.')}"


def _buckets(records: list[SideBySide], all_batches: list[int]) -> list[tuple[SideBySide, list[int]]]:
    """Each shipped record with the batch sizes it covers: from just above the next measured batch below it."""
    out = []
    for r in sorted(records, key=lambda r: r.batch):
        below = [b for b in all_batches if b < r.batch]
        out.append((r, [max(below) + 1 if below else 1, r.batch]))
    return out


def _kernels_dir() -> Path:
    spec = importlib.util.find_spec("kernels")  # its folder, without importing it (which imports every kernel)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the `kernels` package is not importable: the plug-in's kernel files come from it")
    return Path(list(spec.submodule_search_locations)[0])


def write_plugin(dest: Path, choice: Choice, *, study: str, commit: str | None, sglang: str) -> dict[str, Any]:
    """Write ``dest`` (``<export>/sglang_plugin``) for ``choice.shipped`` (not empty); return the manifest."""
    files = Path(__file__).resolve().parent / "sglang_plugin_files"
    pkg = dest / PACKAGE
    (pkg / "kernels").mkdir(parents=True)
    (pkg / "configs").mkdir()
    shutil.copy2(files / "__init__.py", pkg / "__init__.py")
    shutil.copy2(files / "hooks.py", pkg / "hooks.py")
    (pkg / "kernels" / "__init__.py").write_text('"""Kernel files copied from tuner\'s kernels/."""\n')
    by_target: dict[str, list[SideBySide]] = {}
    for r in choice.shipped:
        by_target.setdefault(r.target, []).append(r)
    hooks, configs_by_file = [], {}
    for target, recs in sorted(by_target.items()):
        spec = HOOKS[target]
        shutil.copy2(_kernels_dir() / spec.kernel_file, pkg / "kernels" / spec.kernel_file)
        configs = configs_by_file.setdefault(spec.config_file, {})
        cases: dict[str, list[SideBySide]] = {}
        for r in recs:
            cases.setdefault(json.dumps(r.case(), sort_keys=True), []).append(r)
        entries = []
        for key, rs in sorted(cases.items()):
            measured = sorted(
                {
                    x.batch
                    for x in choice.shipped + [y for y, _ in choice.left_out]
                    if x.target == target and json.dumps(x.case(), sort_keys=True) == key
                }
            )
            buckets = []
            for r, rng in _buckets(rs, measured):
                name = f"{r.arch}-{r.dtypes['dtype']}-h{r.shape['heads']}-b{rng[0]}-{rng[1]}" + (
                    "" if r.shape["norm"] else "-nonorm"
                )
                configs[name] = r.config
                buckets.append(
                    {
                        "batch_range": rng,
                        "measured_batch": r.batch,
                        "config": name,
                        "ours_us": r.ours_us,
                        "sglang_us": r.sglang_us,
                        "speedup": r.sglang_us / r.ours_us,
                        "rel_err": r.rel_err,
                        "gpu": r.gpu,
                        "date": r.date,
                        "commit": r.commit,
                        "sglang": r.sglang,
                        "from": r.source,
                    }
                )
            entries.append({"case": json.loads(key), "buckets": buckets})
        hooks.append(
            {
                "target": target,
                "hook": spec.hook,
                "hook_type": "AROUND",
                "args": list(spec.args),
                "kernel_file": f"kernels/{spec.kernel_file}",
                "config_file": spec.config_file,
                "cases": entries,
            }
        )
    for name, body in configs_by_file.items():
        (pkg / name).write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    version = _version(study, commit)
    manifest = {
        "name": ENTRY,
        "dist": DIST,
        "version": version,
        "study": study,
        "tuner_commit": commit,
        "sglang": sglang,
        "disable_env": DISABLE_ENV,
        "hooks": hooks,
        "left_out": [
            {"target": r.target, "batch": r.batch, "case": r.case(), "why": why, "from": r.source}
            for r, why in choice.left_out
        ],
    }
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    (pkg / "MANIFEST.json").write_text(text)
    (dest / "MANIFEST.json").write_text(text)
    (dest / "pyproject.toml").write_text(f'''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{DIST}"
version = "{version}"
description = "Kernels tuner measured faster than SGLang {sglang}'s own (study {study}), as an SGLang plug-in"
requires-python = ">=3.10"
dependencies = []  # torch, triton and sglang: the server's own

[project.entry-points."sglang.srt.plugins"]
{ENTRY} = "{PACKAGE}:register"

[tool.setuptools]
packages = ["{PACKAGE}", "{PACKAGE}.kernels"]

[tool.setuptools.package-data]
{PACKAGE} = ["MANIFEST.json", "configs/*.json"]
''')
    return manifest


def _summary(manifest: dict[str, Any]) -> str:
    parts = []
    for h in manifest["hooks"]:
        ranges = ", ".join(
            f"{'-'.join(str(x) for x in sorted(set(b['batch_range'])))} ({b['speedup']:.2f}x)"
            for c in h["cases"]
            for b in c["buckets"]
        )
        parts.append(f"{h['target'].rsplit('.', 1)[-1]} at batch {ranges}")
    return "; ".join(parts)


def export_plugin(
    records: list[SideBySide], out: Path, *, study: str, commit: str | None, gpu: str | None, sglang: str | None
) -> Plugin:
    """Write ``out/sglang_plugin`` where a record was chosen; the header lines say what ships or why nothing."""
    if not records:
        return Plugin(
            None,
            None,
            [
                "SGLang plug-in: none; no kernel of this study was measured beside SGLang's own at "
                "the deployment's shapes (the search measures them after its trials on a GPU where the exported "
                "command runs SGLang's glue; benchmarks/sglang_plugin_kernels.py --store adds a run made elsewhere)"
            ],
        )
    choice = choose(records, gpu=gpu)
    if not choice.shipped:
        whys = sorted({why.split(":")[0] for _, why in choice.left_out})
        return Plugin(
            None,
            None,
            [
                f"SGLang plug-in: none; no kernel measured beside SGLang's own was faster within "
                f"tolerance ({len(choice.left_out)} record(s) left out: {', '.join(whys)})"
            ],
        )
    built_for = sglang or choice.shipped[0].sglang
    manifest = write_plugin(out / DIR, choice, study=study, commit=commit, sglang=built_for)
    return Plugin(
        out / DIR,
        manifest,
        [
            f"SGLang plug-in {DIR}/ ({DIST} {manifest['version']}, for SGLang {built_for}): {_summary(manifest)}; "
            f"SGLang's own function elsewhere ({DIR}/MANIFEST.json: figures, sources, what was left out and why)",
            f"  install: pip install ./{DIR}   (SGLang loads it at start; with SGLANG_PLUGINS set, list {ENTRY} in it)",
            f"  off: {DISABLE_ENV}=1 bash launch.sh;  remove: pip uninstall {DIST};  this script runs unchanged "
            "without it",
        ],
    )
