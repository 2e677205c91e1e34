"""Export: hostile values survive the shell; the script passes bash -n, is executable, and nothing is half-written."""

import os
import stat
import subprocess
import sys

import pytest
import yaml
from spaces import FAKE_SPACE

from search_spaces import Hardware, load_space_text, resolve
from storage import Repo
from tuner.errors import ExportError
from tuner.export.script import export_run, render_script
from tuner.figures.verification import read_recorded
from tuner.search.context import SearchOptions
from tuner.search.driver import run_search
from tuner.targets.base import LaunchSpec

HOSTILE = ["/models/my model", "it's", 'say "hi"', "$HOME", "a;rm -rf /tmp/x", "line1\nline2", "`id`", "*", "--"]


@pytest.mark.parametrize("value", HOSTILE)
def test_render_script_quotes_every_value(tmp_path, value):
    spec = LaunchSpec(
        argv=[
            sys.executable,
            "-c",
            "import os,sys; print(repr(sys.argv[1:])); print(repr(os.environ['HOSTILE']))",
            value,
            "--flag",
            value,
        ],
        env={"HOSTILE": value},
    )
    script = tmp_path / "launch.sh"
    script.write_text(render_script(spec, header=[f"study {value}", "x"], recorded={"v": value}, kernel_dir=False))
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == repr([value, "--flag", value])
    assert out[1] == repr(value)
    assert read_recorded(script) == {"v": value}


def test_bad_env_name_is_refused(tmp_path):
    with pytest.raises(ExportError, match="environment variable names must be"):
        render_script(LaunchSpec(argv=["true"], env={"A B": "1"}), header=[], recorded={}, kernel_dir=False)


def test_search_export_writes_script_yaml_and_artifacts(tmp_path, sqlite_url):
    space = tmp_path / "s.yaml"
    space.write_text(FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]"))
    model = '/models/it\'s a "model"; $(reboot)'
    res = run_search(
        SearchOptions(
            budget_s=60,
            storage_url=sqlite_url,
            study="q",
            space_path=str(space),
            out_dir=str(tmp_path / "out"),
            hardware=Hardware(),
            n_trials=4,
            seed=0,
            settings={"model": model},
            confirm_top=0,
        )
    )
    d = tmp_path / "out" / "q"
    script = d / "launch.sh"
    assert res.export_dir == str(d)
    assert os.stat(script).st_mode & stat.S_IXUSR
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "x baseline" in text and "re-measure" in text and "environment:" in text
    doc = yaml.safe_load((d / "best_params.yaml").read_text())
    assert doc["params"] == res.best_params and doc["study"] == "q"
    out = subprocess.run(
        ["bash", "-c", f"source <(grep '^export' {script}); printf %s \"$FAKE_MODEL_PATH\""],
        capture_output=True,
        text=True,
    ).stdout
    assert out == model
    repo = Repo(sqlite_url)
    names = {a.name for a in repo.list_artifacts(repo.get_run("q").id)}
    assert {"launch.sh", "best_params.yaml"} <= names
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".tuner-export-")]


def test_export_to_unwritable_place_leaves_nothing(tmp_path, sqlite_url):
    space = tmp_path / "s.yaml"
    space.write_text(FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]"))
    run_search(
        SearchOptions(
            budget_s=60,
            storage_url=sqlite_url,
            study="q",
            space_path=str(space),
            out_dir=str(tmp_path / "out"),
            hardware=Hardware(),
            n_trials=2,
            confirm_top=0,
        )
    )
    blocker = tmp_path / "file"
    blocker.write_text("")
    repo = Repo(sqlite_url)
    target = __import__("fake_targets").FakeTarget(resolve(load_space_text(space.read_text()), Hardware()), {})
    with pytest.raises(ExportError, match="cannot be created"):
        export_run(repo, "q", blocker / "sub", target=target)
    assert blocker.read_text() == ""
