"""The dry-run's plan for a server target: what one trial takes (the space's estimate, or one probe launch of the
defaults) and how many trials fit the budget; SGLang's ``load_format`` in trials only."""

from __future__ import annotations

import json
import subprocess
import sys

from search_spaces import Hardware, builtin_space_path, load_space, resolve
from tests.server.conftest import SPACE_YAML, standin_command


def _dry_run(tmp_path, *sets: str) -> subprocess.CompletedProcess:
    space = tmp_path / "standin.yaml"
    space.write_text(SPACE_YAML)
    args = [
        sys.executable,
        "-m",
        "tuner.cli",
        "search",
        "--target",
        "command",
        "--space",
        str(space),
        "--model",
        "m",
        "--budget",
        "100s",
        "--dry-run",
        "--storage",
        f"sqlite:///{tmp_path / 't.db'}",
        "--set",
        "command=" + json.dumps(standin_command()),
        "--set",
        "port_range=38000-38999",
        "--set",
        "prompt_len=8",
        "--set",
        "output_len=8",
        "--set",
        "min_requests=2",
        "--set",
        "level_s=0.2",
    ]
    for kv in sets:
        args += ["--set", kv]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_the_dry_run_plans_from_the_spaces_trial_estimate(tmp_path):
    done = _dry_run(tmp_path, "trial_estimate_s=20")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "  trial seconds: 20 (the space's trial_estimate_s" in done.stdout
    assert "  trials that fit the budget: about 5 (100 s / 20 s a trial)" in done.stdout


def test_a_probe_launch_measures_what_one_trial_takes(tmp_path):
    done = _dry_run(tmp_path, "probe_launch=true", "extra_args=[--startup-delay, '0.5']")
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("  trial seconds: "))
    seconds = float(line.split()[2])
    assert 0.5 < seconds < 30 and "probe launch of the defaults: start-up" in line and "warm-up" in line, line
    assert "trials that fit the budget: about" in done.stdout


def test_a_probe_launch_that_fails_is_an_error_with_its_reason(tmp_path):
    done = _dry_run(tmp_path, "probe_launch=true", "extra_args=[--oom-at-start]")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ERROR: probe launch of the defaults: oom: " in done.stdout
    assert "torch.OutOfMemoryError: CUDA out of memory" in done.stdout


def test_sglang_trials_load_dummy_weights_and_the_export_the_real_ones():
    from tuner.targets.server.sglang_server import SGLangTarget

    space = resolve(
        load_space(builtin_space_path("sglang_dsv4_flash")),
        Hardware(gpu_name="NVIDIA H200", gpu_count=8, compute_capability=(9, 0)),
    )
    target = SGLangTarget(space, {"load_format": "dummy"})
    args, _ = target.flag_args(space.defaults())
    assert target.trial_argv(args, 30001)[-2:] == ["--load-format", "dummy"]
    assert "--load-format" not in target.launch_spec(space.defaults()).argv
    report = target.preflight()
    assert report.ok, "\n".join(report.lines())
    assert any("--load-format dummy" in line for line in report.will_run)
    bad = SGLangTarget(space, {"load_format": "dumy"}).preflight()
    assert any(
        e.startswith("setting `load_format`: 'dumy' is not one of the choices of --load-format") for e in bad.errors
    ), bad.errors
