"""The SGLang plug-in in a workload study's export: only buckets measured faster than SGLang's own kernel ship; the
package installs into a fresh virtualenv, SGLang 0.5.23's own ``load_plugins()`` finds it through its entry point
and applies its hook to a function that exists there; disabled it does nothing; a renamed target gives one line."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tuner.export.sglang_plugin import DIST, ENTRY, HOOKS, SideBySide, choose, read_records, store_records

TARGET = "sglang.kernels.ops.attention.dsv4.norm_rope.fused_q_norm_rope"


def record(batch, ours, theirs, *, rel_err=3e-3, baseline="sglang", date="2026-12-03T05:00", norm=True):
    return SideBySide(
        target=TARGET,
        batch=batch,
        shape={"heads": 64, "head_dim": 512, "rope_dim": 64, "norm": norm},
        dtypes={"dtype": "bfloat16", "out_dtype": "bfloat16"},
        ours_us=ours,
        sglang_us=theirs,
        rel_err=rel_err,
        gpu="NVIDIA H200",
        arch="sm_90",
        date=date,
        commit="abc123",
        sglang="0.5.23",
        baseline=baseline,
        config={"BLOCK_H": 2, "num_warps": 4},
        source="h200.json",
    )


def test_only_faster_buckets_within_tolerance_beside_sglangs_own_kernel_ship():
    recs = [
        record(1, 4.0, 5.0),
        record(16, 6.0, 5.5),
        record(64, 7.0, 9.0),
        record(1, 3.0, 5.0, baseline="torch", norm=False),
        record(16, 3.0, 5.0, rel_err=0.5, norm=False),
        record(64, 9.0, 9.0, date="2026-12-01T00:00"),
    ]
    c = choose(recs)
    assert sorted(r.batch for r in c.shipped) == [1, 64]
    why = {(r.batch, r.shape["norm"], r.date[:10]): w for r, w in c.left_out}
    assert why[(16, True, "2026-12-03")].startswith("not faster: ours 6.00 us vs SGLang 5.50 us")
    assert "torch implementation" in why[(1, False, "2026-12-03")]
    assert why[(16, False, "2026-12-03")].startswith("numerics: rel err 0.5")
    assert why[(64, True, "2026-12-01")].startswith("superseded")
    assert choose(recs, gpu="NVIDIA H100").shipped == []  # measured on another GPU than the study's


def test_a_kernel_ships_only_where_it_was_faster_beyond_the_noise():
    """With repeat rounds: slower than SGLang's in no round; without: by MIN_GAIN over the two medians."""
    from dataclasses import replace

    from tuner.export.sglang_plugin import MIN_GAIN

    clear = replace(record(1, 4.9, 5.4), ours_rounds_us=[4.8, 4.9, 5.0], sglang_rounds_us=[5.3, 5.4, 5.5])
    overlap = replace(record(16, 4.9, 5.2), ours_rounds_us=[4.8, 4.9, 5.3], sglang_rounds_us=[5.1, 5.2, 5.4])
    thin = record(64, 5.0, 5.0 * (1 + MIN_GAIN / 2))  # an old record: medians alone, under the margin
    wide = record(32, 5.0, 5.0 * (1 + 2 * MIN_GAIN))
    c = choose([clear, overlap, thin, wide])
    assert sorted(r.batch for r in c.shipped) == [1, 32]
    why = {r.batch: w for r, w in c.left_out}
    assert why[16].startswith("not faster beyond the noise (slower in a round") and "rounds: ours 4.80-5.30" in why[16]
    assert why[64].startswith(f"not faster beyond the noise (under {MIN_GAIN:.0%})")


def _workload_study(tmp_path, records):
    from spaces import tiny_workload_run

    from storage.types import MetricRow

    repo, run, space = tiny_workload_run(f"sqlite:///{tmp_path / 't.db'}", "twin-pl", budget_s=60)
    for n, value in ((0, 10.0), (1, 12.0)):
        repo.start_trial(run.id, n, {**space.defaults(), **({"context_length": 4096} if n else {})}, is_baseline=n == 0)
        repo.finish_trial(
            run.id,
            n,
            outcome="ok",
            value=value,
            metrics=[MetricRow("tok_s", f"c={c}", value * c, "tok/s") for c in (1, 16, 64)],
            duration_s=1.0,
        )
    repo.set_baseline(run.id, 10.0)
    repo.set_best(run.id, 1, 12.0)
    if records:
        store_records(repo, "twin-pl", records, "h200-run")
    return repo, space


def _export(tmp_path, records):
    from search_spaces import Hardware, resolve
    from tuner.export.script import export_run
    from tuner.targets.workload.target import WorkloadTarget

    repo, space = _workload_study(tmp_path, records)
    dest = export_run(repo, "twin-pl", tmp_path / "out", target=WorkloadTarget(resolve(space, Hardware()), {}))
    return repo, dest


def test_without_a_side_by_side_record_no_plugin_is_written_and_launch_sh_says_why(tmp_path):
    _, dest = _export(tmp_path, [])
    assert not (dest / "sglang_plugin").exists()
    text = (dest / "launch.sh").read_text()
    assert "# SGLang plug-in: none; no kernel of this study was measured beside SGLang's own" in text


def test_with_only_slower_records_no_plugin_is_written_and_launch_sh_counts_them(tmp_path):
    _, dest = _export(tmp_path, [record(16, 6.0, 5.5)])
    assert not (dest / "sglang_plugin").exists()
    assert (
        "SGLang plug-in: none; no kernel measured beside SGLang's own was faster within tolerance (1 record(s) "
        "left out: not faster)" in (dest / "launch.sh").read_text()
    )


def test_the_plugin_ships_the_faster_buckets_with_their_figures_and_stored_records(tmp_path):
    recs = [record(1, 4.0, 5.0), record(16, 6.0, 5.5), record(64, 7.0, 9.0)]
    repo, dest = _export(tmp_path, recs)
    assert sorted(r.batch for r in read_records(repo, repo.get_run("twin-pl").id)) == [1, 16, 64]
    man = json.loads((dest / "sglang_plugin" / "MANIFEST.json").read_text())
    (hook,) = man["hooks"]
    assert hook["target"] == TARGET and hook["hook_type"] == "AROUND"
    buckets = hook["cases"][0]["buckets"]
    assert [b["batch_range"] for b in buckets] == [[1, 1], [17, 64]]
    assert buckets[1]["ours_us"] == 7.0 and buckets[1]["sglang_us"] == 9.0 and buckets[1]["from"] == "h200.json"
    assert [(x["batch"], x["why"][:11]) for x in man["left_out"]] == [(16, "not faster:")]
    pkg = dest / "sglang_plugin" / "tuner_sglang_plugin"
    assert (pkg / "kernels" / "sglang_q_norm_rope.py").is_file()
    assert json.loads((pkg / "configs" / "q_norm_rope.json").read_text())[buckets[0]["config"]] == {
        "BLOCK_H": 2,
        "num_warps": 4,
    }
    pyproject = (dest / "sglang_plugin" / "pyproject.toml").read_text()
    assert f'name = "{DIST}"' in pyproject and '[project.entry-points."sglang.srt.plugins"]' in pyproject
    assert f'version = "{man["version"]}"' in pyproject and "+twin.pl.g" in man["version"]
    text = (dest / "launch.sh").read_text()
    assert "# SGLang plug-in sglang_plugin/" in text and "fused_q_norm_rope at batch 1 (1.25x), 17-64 (1.29x)" in text
    assert "#   install: pip install ./sglang_plugin" in text and f"list {ENTRY} in it" in text
    # the command's fp8 configuration cannot run on this CPU, so the search never measured it: nothing to compare
    assert "#   with this plug-in: not predicted (the command's configuration was not measured here)" in text
    assert not (dest / "remeasure_plugin.sh").exists()
    assert "SGLANG_PLUGINS" not in text.split("set -euo pipefail")[1]  # runs unchanged without the plug-in
    assert any(a.name == "sglang_plugin/MANIFEST.json" for a in repo.list_artifacts(repo.get_run("twin-pl").id))


CHECK = r"""
import json, logging, pkgutil, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout)
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
load_plugins()
for t in sys.argv[1:]:
    fn = pkgutil.resolve_name(t)
    print("RESULT", t, "hooked" if t in HookRegistry._patched and hasattr(fn, "__wrapped__") else "unhooked")
"""


def _venv(tmp_path) -> Path:
    """A fresh virtualenv seeing this interpreter's packages (torch, sglang, tvm_ffi) and nothing installed yet."""
    root = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True).create(root)  # pip and setuptools: the shared ones
    py = root / "bin" / "python"
    purelib = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "_outer_site.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return py


def _pip(py, *args):
    done = subprocess.run([py, "-m", "pip", "-q", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _run(py, *targets, env=None):
    return subprocess.run(
        [py, "-c", CHECK, *targets],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        cwd="/",
    )


@pytest.mark.slow
def test_the_plugin_installs_sglang_loads_it_and_a_renamed_target_gives_one_line(tmp_path):
    pytest.importorskip("sglang")
    if subprocess.run([sys.executable, "-c", "import tvm_ffi"], capture_output=True).returncode:
        pytest.skip("SGLang 0.5.23's dsv4 kernels import tvm_ffi: install apache-tvm-ffi==0.1.11 (scripts/test.sh)")
    _, dest = _export(tmp_path, [record(1, 4.0, 5.0)])
    py = _venv(tmp_path)
    _pip(py, "install", "--no-deps", "--no-build-isolation", str(dest / "sglang_plugin"))
    done = _run(py, *HOOKS, env={"SGLANG_PLUGINS": ENTRY})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"RESULT {TARGET} hooked" in done.stdout, done.stdout[-3000:]
    assert "INFO tuner_sglang_plugin: tuner plug-in" in done.stdout and "1 hook(s)" in done.stdout
    # disabled: SGLang runs its own function and the plug-in says nothing
    off = _run(py, TARGET, env={"TUNER_PLUGIN_DISABLE": "1"})
    assert f"RESULT {TARGET} unhooked" in off.stdout
    assert not re.search(r"^\w+ tuner_sglang_plugin:", off.stdout + off.stderr, re.M), off.stdout  # its logger
    # a target renamed in another release: one warning line naming it and the release, no traceback
    renamed = TARGET + "_v2"
    for f in (
        dest / "sglang_plugin" / "MANIFEST.json",
        dest / "sglang_plugin" / "tuner_sglang_plugin" / "MANIFEST.json",
    ):
        f.write_text(f.read_text().replace(f'"{TARGET}"', f'"{renamed}"'))
    _pip(py, "install", "--no-deps", "--no-build-isolation", "--force-reinstall", str(dest / "sglang_plugin"))
    bad = _run(py, TARGET)
    assert bad.returncode == 0 and f"RESULT {TARGET} unhooked" in bad.stdout, bad.stderr[-3000:]
    lines = [ln for ln in (bad.stdout + bad.stderr).splitlines() if renamed in ln]
    assert len(lines) == 1 and lines[0].startswith("WARNING tuner_sglang_plugin:") and "SGLang 0.5.23" in lines[0]
    assert "Traceback" not in bad.stdout + bad.stderr
    # reversible: pip uninstall removes the entry point
    _pip(py, "uninstall", "-y", DIST)
    eps = subprocess.run(
        [
            py,
            "-c",
            "from importlib.metadata import entry_points; "
            "print([e.name for e in entry_points(group='sglang.srt.plugins')])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ENTRY not in eps


def test_the_twin_loads_the_exported_plugin_through_sglangs_hook_registry_and_refuses_one_not_applied(tmp_path):
    """The twin's runner (what remeasure_plugin.sh runs) registers and applies the plug-in as SGLang's load_plugins()
    does and names the function it replaced before measuring; disabled, it refuses to measure rather than time
    SGLang's own function under the plug-in's name. (The command's fp8 configuration itself needs a GPU: here the
    tiny preset's CPU defaults run.)"""
    _, dest = _export(tmp_path, [record(1, 4.0, 5.0), record(64, 7.0, 9.0)])
    argv = [sys.executable, "-m", "tuner.targets.workload.run", "--preset", "dsv4-flash-tiny", "--levels", "1"]
    argv += ["--repeats", "1", "--json"]
    env = {**os.environ, "TUNER_SGLANG_PLUGIN": str(dest / "sglang_plugin")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"SGLang plug-in {dest / 'sglang_plugin'}: {TARGET}" in done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["c=1"] > 0
    off = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**env, "TUNER_PLUGIN_DISABLE": "1"})
    assert off.returncode == 2 and f"its hook on {TARGET} was not applied" in off.stderr, off.stderr[-2000:]


def test_where_the_command_ran_the_export_measures_it_with_the_plugin_and_verify_re_measures_that(tmp_path):
    """The prediction "with this plug-in" is remeasure_plugin.sh's own output at export (here a target whose
    re-measure prints fixed figures, standing in for the twin on a GPU): the header gives it against the baseline,
    the script records it, launch.sh names the script, and `tuner verify` runs it beside the other two."""
    from search_spaces import Hardware, resolve
    from tuner.export.script import export_run
    from tuner.targets import LaunchSpec
    from tuner.targets.workload.target import WorkloadTarget
    from tuner.targets.workload.verify import verify_workload

    class Fixed(WorkloadTarget):
        def launch_spec(self, params):
            code = (
                "import json, os, sys; plug = os.environ['TUNER_SGLANG_PLUGIN']; assert os.path.isfile(plug + "
                "'/MANIFEST.json'); print(json.dumps({'c=1': 11.0, 'c=16': 165.0, 'c=64': 660.0}))"
            )
            return LaunchSpec(argv=[sys.executable, "-c", code])

        def deployment(self, params, *, environment, repo, run_id):
            dep = super().deployment(params, environment=environment, repo=repo, run_id=run_id)
            return dataclasses.replace(dep, params=dict(params), same=True)  # the best is the command here

    repo, space = _workload_study(tmp_path, [record(1, 4.0, 5.0)])
    dest = export_run(repo, "twin-pl", tmp_path / "out", target=Fixed(resolve(space, Hardware()), {}))
    text = (dest / "launch.sh").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("#   with this plug-in: "))
    assert (
        line
        == "#   with this plug-in: c=1 1.10x (11.0), c=16 1.03x (165.0), c=64 1.03x (660.0) (one run of remeasure_plugin.sh at export)"
    )
    rec = json.loads(next(ln for ln in text.splitlines() if ln.startswith("# tuner-recorded: "))[18:])
    assert rec["remeasure_plugin"] == "remeasure_plugin.sh"
    prec = json.loads(
        next(
            ln for ln in (dest / "remeasure_plugin.sh").read_text().splitlines() if ln.startswith("# tuner-recorded: ")
        )[18:]
    )
    assert prec["by_level"] == {"1": 11.0, "16": 165.0, "64": 660.0}
    res = verify_workload(dest / "launch.sh", rec, 0.15, 300.0)
    assert res.plugin is not None and res.plugin.ok and res.plugin.by_level == {1: 11.0, 16: 165.0, 64: 660.0}
    assert "the exported command with the SGLang plug-in loaded (remeasure_plugin.sh):" in "\n".join(res.lines())
