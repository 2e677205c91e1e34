"""The greedy check of server targets (``greedy_check``) on the stand-in server, whose ``--quantize`` knob is faster
and makes the greedy completions of its even-length prompts diverge half-way: the agreement arithmetic, one trial's
check against a stored reference (token ids, and text when the server refuses ``return_token_ids``), and whole
searches in a real database where the quantized value is ``wrong_result`` while the correct faster value wins, the
reference stays the baseline's across a resume, and status, best, explain, the export and the dry-run say so."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from storage import Repo
from tests.server.conftest import standin_command
from tuner.search.context import SearchOptions, open_optuna_storage
from tuner.search.driver import run_search
from tuner.targets.server import greedy

CHECK = {"prompts": 8, "tokens": 32, "min_agreement": 0.9}
# the stand-in's --quantize: the 3 even-length prompts of the first 8 agree on 16 of 32 tokens, the others on all
QUANTIZED_AGREEMENT = sum(0.5 if len(p) % 2 == 0 else 1.0 for p in greedy.PROMPTS[:8]) / 8

SPACE = """
name: greedy-standin
target: command
objective: {metric: tok_s, combine: geomean, levels: [1, 2]}
params:
  quantize: {type: bool, default: false, flag: --quantize}
  fast: {type: bool, default: false, flag: --enable-fast-path}
"""
FAST = {
    "prompt_len": 8,
    "output_len": 10,
    "min_requests": 4,
    "rounds": 1,
    "warmup_requests": 1,
    "level_s": 0.3,
    "port_range": "40000-40999",
    "teardown_reserve_s": 3.0,
    "trial_timeout_s": 30,
}


def test_agreement_is_the_mean_common_prefix_share_in_token_ids_else_in_text():
    C = greedy.Completion
    assert greedy.prompt_agreement(C("a b c d", [1, 2, 3, 4]), C("a b x y", [1, 2, 9, 9])) == 0.5
    assert greedy.prompt_agreement(C("abcd", [1, 2, 3, 4]), C("abcd", [1, 2])) == 0.5  # stopped early
    assert greedy.prompt_agreement(C("abcd"), C("abxx", [1, 2, 3, 4])) == 0.5  # one side without ids: text
    assert greedy.prompt_agreement(C(""), C("")) == 1.0
    assert greedy.agreement([C("ab", [1, 2]), C("cd", [3, 4])], [C("ab", [1, 2]), C("cx", [3, 5])]) == 0.75
    assert greedy.agreement([C("a")], []) == 0.0


def test_the_setting_is_typed_and_refuses_a_bad_count_naming_it():
    from tuner.errors import SettingsError
    from tuner.targets.server.settings import ServerSettings

    assert ServerSettings.parse({}, owner="t").greedy_check is None
    cfg = ServerSettings.parse({"greedy_check": {"prompts": 3, "tokens": 4}}, owner="t").greedy_check
    assert cfg.prompt_list() == list(greedy.PROMPTS[:3]) and cfg.min_agreement == 0.9
    assert ServerSettings.parse({"greedy_check": {"prompts": ["hi"]}}, owner="t").greedy_check.prompt_list() == ["hi"]
    with pytest.raises(SettingsError, match=r"greedy_check.prompts.*1-16, but got 40"):
        ServerSettings.parse({"greedy_check": {"prompts": 40}}, owner="t")


def _evaluate(make_target, extra_args=(), **settings):
    t = make_target(list(extra_args), greedy_check=CHECK, **settings)
    return t, t.evaluate(t.resolved.defaults(), time.time() + 60)


def test_a_trial_without_a_stored_reference_becomes_it_and_hands_its_token_ids_back(make_target):
    t, m = _evaluate(make_target, greedy_is_baseline=True)
    assert m.outcome.value == "ok", m.reason
    assert m.metric("greedy_agreement") == 1.0 and m.metric("greedy_reference") == 1.0
    assert m.metric("constraint", "greedy_agreement>=0.9") == pytest.approx(-0.1)
    doc = m.data["greedy"]
    assert doc["token_ids"] is True and len(doc["completions"]) == 8
    assert all(len(c["token_ids"]) == 32 for c in doc["completions"])
    assert doc["prompts"] == list(greedy.PROMPTS[:8])


def test_a_quantized_server_is_wrong_result_against_the_stored_reference_before_its_levels(make_target):
    _, base = _evaluate(make_target)
    ref = base.data["greedy"]
    _, m = _evaluate(make_target, ["--quantize"], greedy_reference=ref)
    assert m.outcome.value == "wrong_result", m.reason
    assert m.metric("greedy_agreement") == pytest.approx(QUANTIZED_AGREEMENT)
    assert m.metric("constraint", "greedy_agreement>=0.9") == pytest.approx(0.9 - QUANTIZED_AGREEMENT)
    assert "min_agreement 0.9" in m.reason and f"{QUANTIZED_AGREEMENT:.3f}" in m.reason
    assert m.metric("tok_s", "c=1") is None  # no level was measured
    assert m.metric("greedy_reference") is None
    _, same = _evaluate(make_target, ["--enable-fast-path"], greedy_reference=ref)
    assert same.outcome.value == "ok" and same.metric("greedy_agreement") == 1.0


def test_a_server_refusing_return_token_ids_is_compared_as_text(make_target):
    strict = ["--reject-field", "return_token_ids"]
    _, base = _evaluate(make_target, strict)
    ref = base.data["greedy"]
    assert ref["token_ids"] is False and all(c["token_ids"] is None for c in ref["completions"])
    _, m = _evaluate(make_target, strict + ["--quantize"], greedy_reference=ref)
    assert m.outcome.value == "wrong_result"
    assert 0.5 < m.metric("greedy_agreement") < 0.9  # characters: the diverging prompts agree on about half


def test_a_server_ignoring_return_token_ids_records_no_token_ids(make_target):
    _, base = _evaluate(make_target, ["--ignore-token-ids"])
    ref = base.data["greedy"]
    assert ref["token_ids"] is False and all(c["token_ids"] is None for c in ref["completions"])


def test_the_dry_run_plan_says_the_greedy_check_is_not_timed_without_an_estimate(make_target):
    t = make_target(greedy_check=CHECK)
    line = t._greedy_plan(None)
    assert "counted in trial_estimate_s" not in line and "not timed (set `trial_estimate_s`" in line
    assert "counted in trial_estimate_s" in make_target(greedy_check=CHECK, trial_estimate_s=20)._greedy_plan(None)


def test_the_chat_api_is_checked_through_the_chat_endpoint(make_target):
    _, base = _evaluate(make_target, api="chat")
    ref = base.data["greedy"]
    assert ref["completions"][0]["text"].startswith(" w") and ref["token_ids"] is True
    _, m = _evaluate(make_target, ["--quantize"], api="chat", greedy_reference=ref)
    assert m.outcome.value == "wrong_result"
    assert m.metric("greedy_agreement") == pytest.approx(QUANTIZED_AGREEMENT)


def test_a_reference_stored_first_by_another_worker_stays_and_the_late_trial_is_judged_against_it(
    make_target, tmp_path
):
    """Two trials found no reference (parallel workers): the first stored stays, the second is judged again."""
    repo = Repo(f"sqlite:///{tmp_path / 'r.db'}")
    repo.create_schema()
    run = repo.create_run("r", target="command", budget_s=60)
    target, base = _evaluate(make_target, greedy_is_baseline=True)
    assert target.after_trial(repo, run.id, 0, base, is_baseline=True) is base and "greedy" not in base.data
    _, late = _evaluate(make_target, ["--quantize"])  # no reference passed in: its own
    assert late.outcome.value == "ok" and late.metric("greedy_reference") == 1.0
    settled = target.after_trial(repo, run.id, 3, late, is_baseline=False)
    assert settled.outcome.value == "wrong_result" and settled.value is None
    assert settled.metric("greedy_agreement") == pytest.approx(QUANTIZED_AGREEMENT)
    assert settled.metric("greedy_reference") is None
    # the SLO's constraint row is kept, the check's replaced
    assert sorted(r.level for r in settled.metrics if r.metric == "constraint") == [
        "greedy_agreement>=0.9",
        "ttft_ms_p99@c=4<=500",
    ]
    assert _reference(repo, "r")["trial"] == 0
    # what the next trial process is given: the stored reference, and whether it is the baseline
    given = target.trial_settings(repo, run.id, is_baseline=False)
    assert given["greedy_reference"]["trial"] == 0 and given["greedy_is_baseline"] is False


def _search(tmp_path: Path, n_trials: int, *, resume: bool = False, check=CHECK, name: str = "g") -> tuple:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    opts = SearchOptions(
        budget_s=150,
        storage_url=url,
        study=name,
        space_path=str(space),
        target="command",
        # 200 tok/s: a request's time is the stand-in's pacing (50 ms for 10 tokens), not the loaded CPU's HTTP
        # overhead, so the 1.5x of --enable-fast-path stays beyond the runs' spread on a busy 2-core CI machine
        settings={
            "command": standin_command() + ["--tokens-per-second", "200"],
            "model": "standin",
            **FAST,
            "greedy_check": check,
        },
        n_trials=n_trials,
        confirm_top=0,
        refine_share=0.0,
        seed=3,
        resume=resume,
        out_dir=str(tmp_path / "out"),
    )
    return run_search(opts), Repo(url), url


def _reference(repo: Repo, name: str = "g") -> dict:
    run = repo.get_run(name)
    arts = [a for a in repo.list_artifacts(run.id) if a.kind == greedy.ARTIFACT_KIND]
    assert len(arts) == 1, [a.name for a in arts]
    return json.loads(bytes(arts[0].content).decode())


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A 2-trial search (the baseline and one other configuration), then a resume of 8 more: every configuration of
    the 2x2 space is run, two of them first in the resume (a proposal that repeats a timed configuration is sampled
    again, so a longer first search would leave the resume nothing new to run)."""
    tmp = tmp_path_factory.mktemp("greedy")
    first, repo, url = _search(tmp, 2)
    ref_after_first = _reference(repo)
    second, _, _ = _search(tmp, 8, resume=True)
    return tmp, first, second, repo, url, ref_after_first


def test_the_quantized_value_is_wrong_result_and_the_correct_faster_value_wins(searched):
    _, first, second, repo, url, _ = searched
    trials = list({t.number: t for t in first.trials + second.trials if t.repeat_of is None}.values())
    quantized = [t for t in trials if t.params["quantize"]]
    assert quantized and all(t.outcome == "wrong_result" for t in quantized), [(t.params, t.outcome) for t in trials]
    run = repo.get_run("g")
    best = repo.get_trial(run.id, run.best_trial_number)
    runs = [(t.number, t.params, t.outcome, t.value) for t in first.trials + second.trials]
    assert best.params == {"quantize": False, "fast": True}, (second.note, runs)
    # the agreement is an Optuna constraint: violated by the quantized trials, met by the others
    study = optuna.load_study(study_name="g", storage=open_optuna_storage(url))
    by_number = {ft.number: ft.user_attrs.get("constraints") for ft in study.get_trials()}
    for t in trials:
        expect = 0.9 - (QUANTIZED_AGREEMENT if t.params["quantize"] else 1.0)
        assert by_number[t.number] == [pytest.approx(expect)], (t.number, t.params, by_number[t.number])


def test_the_reference_is_the_baseline_and_a_resume_keeps_comparing_with_it(searched):
    _, first, second, repo, _, ref_after_first = searched
    base = next(t for t in first.trials if t.is_baseline)
    assert ref_after_first["trial"] == base.number and ref_after_first["is_baseline"] is True
    assert _reference(repo) == ref_after_first  # the resume stored no other
    run = repo.get_run("g")
    done_before = max(t.number for t in first.trials)
    resumed = [t for t in second.trials if t.repeat_of is None and t.number > done_before]
    assert any(t.params["quantize"] for t in resumed), [(t.number, t.params) for t in second.trials]
    for t in resumed:
        rec = repo.get_trial(run.id, t.number)
        got = {m.metric: m.value for m in rec.measurements}
        assert "greedy_reference" not in got  # compared, not its own reference
        assert got["greedy_agreement"] == pytest.approx(QUANTIZED_AGREEMENT if t.params["quantize"] else 1.0)


def test_status_best_and_explain_show_the_agreement(searched):
    from tuner.cli import app

    _, _, _, repo, url, _ = searched
    runner = CliRunner()
    status = runner.invoke(app, ["status", "--storage", url, "--study", "g"], env={"COLUMNS": "250"})
    assert status.exit_code == 0, status.output
    assert "greedy agr." in status.output and f"{QUANTIZED_AGREEMENT:.3f}" in status.output
    best = runner.invoke(app, ["best", "--storage", url, "--study", "g"], env={"COLUMNS": "250"})
    assert "greedy check: completions agree with the baseline's on 1.000" in best.output, best.output
    from tuner.explain import explain

    ex = explain(url, "g", profile=False)
    md = ex.markdown()
    assert "## Greedy check" in md and "The best's completions agree with the baseline's on 1.000" in md
    assert f"was wrong_result (agreement {QUANTIZED_AGREEMENT:.3f}): quantize=True" in md


def test_the_export_header_names_the_agreement_of_the_exported_configuration(searched):
    tmp, first, _, _, _, _ = searched
    text = (Path(first.export_dir) / "launch.sh").read_text()
    line = next(ln for ln in text.splitlines() if "greedy check:" in ln)
    assert line.startswith("#   greedy check: completions agree with the baseline's on 1.000"), line
    assert "min_agreement 0.9" in line
    assert "--quantize" not in text.split("tuner-recorded")[1]


def test_the_dry_run_plan_lists_the_greedy_checks_cost(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
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
        "port_range=41000-41999",
        "--set",
        "output_len=10",
        "--set",
        "min_requests=4",
        "--set",
        "rounds=1",
        "--set",
        "greedy_check={prompts: 4, tokens: 16}",
    ]
    est = subprocess.run(args + ["--set", "trial_estimate_s=20"], capture_output=True, text=True, timeout=120)
    assert est.returncode == 0, est.stdout + est.stderr
    line = next(ln for ln in est.stdout.splitlines() if ln.startswith("  greedy check: "))
    assert "4 fixed prompts x 16 tokens (64 tokens, one request at a time) once per trial" in line
    assert "the levels send at least 80" in line and "counted in trial_estimate_s" in line
    probe = subprocess.run(
        args + ["--set", "probe_launch=true", "--set", "level_s=0.2"], capture_output=True, text=True, timeout=120
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr
    line = next(ln for ln in probe.stdout.splitlines() if ln.startswith("  greedy check: "))
    assert line.endswith(" s in the probe launch"), line


def test_sglangs_dummy_weights_with_the_greedy_check_are_flagged_in_the_preflight():
    from search_spaces import Hardware, builtin_space_path, load_space, resolve
    from tuner.targets.server.sglang_server import SGLangTarget

    space = resolve(
        load_space(builtin_space_path("sglang_dsv4_flash")),
        Hardware(gpu_name="NVIDIA H200", gpu_count=8, compute_capability=(9, 0)),
    )
    report = SGLangTarget(space, {"load_format": "dummy", "greedy_check": CHECK}).preflight()
    assert report.ok, "\n".join(report.lines())
    assert any(r.startswith("greedy check on `--load-format dummy` weights") for r in report.rules), report.rules
    plain = SGLangTarget(space, {"load_format": "dummy"}).preflight()
    assert not any("greedy check" in r for r in plain.rules)
