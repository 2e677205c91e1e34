"""tuner explain: importances per level and the ablation of the best configuration's changes."""

import subprocess
import sys

from spaces import FAKE_SPACE

from search_spaces import Hardware
from storage import Repo
from tuner.explain import ablate, explain
from tuner.search.context import SearchOptions
from tuner.search.driver import run_search

SPACE = (
    FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]")
    + """
  y:
    type: categorical
    values: [a, b]
    default: a
"""
)


def test_explain_ranks_the_parameter_that_matters_and_ablation_measures_it(tmp_path, sqlite_url):
    space = tmp_path / "s.yaml"
    space.write_text(SPACE)
    res = run_search(
        SearchOptions(
            budget_s=120,
            storage_url=sqlite_url,
            study="e",
            space_path=str(space),
            out_dir=str(tmp_path / "o"),
            hardware=Hardware(),
            n_trials=12,
            seed=3,
            confirm_top=0,
        )
    )
    assert res.best_params["x"] > 0
    ex = explain(sqlite_url, "e", profile=False)
    imp = ex.importances["objective"]
    assert imp and next(iter(imp)) == "x"  # the fake's value depends on x only
    assert "tok/s at c=4" in ex.importances
    ok = [t for t in res.trials if t.outcome == "ok" and "not run again" not in t.reason]
    assert ex.importance_trials == len(ok) and f"Importances from {len(ok)} successful trials" in ex.markdown()
    # the search's own trials one value away from the best (its last quarter was moves from the best)
    best = next(t for t in res.trials if t.number == Repo(sqlite_url).get_run("e").best_trial_number)
    assert ex.neighbours and "One value away from the best" in ex.markdown()
    for row in ex.neighbours:
        t = next(t for t in res.trials if t.number == row["trial"])
        assert {k for k in t.params if t.params[k] != best.params[k]} == {row["param"]}
        assert abs(row["ratio"] - best.value / t.value) < 1e-9
        if row["param"] == "x":  # the fake's value grows with x: the best's x wins against a lower one
            assert (row["ratio"] > 1) == (row["other"] < best.params["x"])
    ab = ablate(sqlite_url, "e")
    rows = {r["param"]: r for r in ab.ablation}
    assert rows["x"]["from"] == 0 and rows["x"]["outcome"] == "ok"
    want = (10.0 + 5 * res.best_params["x"]) / 10.0  # the fake's tok/s is linear in x
    assert abs(rows["x"]["loss"][4] - want) < 1e-6
    if "y" in rows:
        assert abs(rows["y"]["loss"][4] - 1.0) < 1e-6  # y changes nothing
    assert ab.ablation[0]["param"] == "x"
    text = ab.markdown()
    assert "put back to its baseline value" in text and "| x |" in text


def test_ablation_reports_after_every_rerun_and_the_cli_keeps_the_file(tmp_path, sqlite_url):
    from typer.testing import CliRunner

    from tuner.cli import app

    space = tmp_path / "s.yaml"
    space.write_text(SPACE)
    run_search(
        SearchOptions(
            budget_s=120,
            storage_url=sqlite_url,
            study="p",
            space_path=str(space),
            out_dir=str(tmp_path / "o"),
            hardware=Hardware(),
            n_trials=10,
            seed=5,
            confirm_top=0,
        )
    )
    seen = []
    ab = ablate(sqlite_url, "p", on_row=lambda ex: seen.append((len(ex.alone), len(ex.ablation))))
    n = len(ab.ablation)
    assert n and len(ab.alone) == n
    # one call per re-run, each parameter alone on the baseline and then undone from the best
    assert seen == [(i // 2 + 1, (i + 1) // 2) for i in range(2 * n)]
    # the tables are stored with the study, for the export to name each flagless knob's measured gain
    from tuner.targets.workload.deploy import read_ablation

    repo = Repo(sqlite_url)
    stored = read_ablation(repo, repo.get_run("p").id)
    assert [r["param"] for r in stored["undo"]] == [r["param"] for r in ab.ablation]
    assert [r["param"] for r in stored["alone"]] == [r["param"] for r in ab.alone]
    report = tmp_path / "why.md"
    r = CliRunner().invoke(
        app, ["explain", "--storage", sqlite_url, "--study", "p", "--no-profile", "--ablate", "--out", str(report)]
    )
    assert r.exit_code == 0, r.output
    assert "put back to its baseline value" in report.read_text() and "worth alone" in report.read_text()
    assert not list(tmp_path.glob(".why.md.tmp"))  # written whole, through a temporary file


# x sets the speed; k only exists when a=on; mode (left at its default, raise: the fake target fails) only exists
# when a=on and b=off, so `a` alone on the baseline and the best without `b` fail while baseline and best run
COND_SPACE = """
name: cond
target: fake_targets:FakeTarget
settings: {sleep_s: 0.0}
objective: {metric: tok_s, combine: geomean, levels: [1, 4]}
params:
  x: {type: categorical, values: [0, 4], default: 0}
  a: {type: categorical, values: ["off", "on"], default: "off"}
  k: {type: categorical, values: [1, 3], default: 1, when: {a: ["on"]}}
  b: {type: categorical, values: ["off", "on"], default: "off"}
  mode: {type: categorical, values: [ok, raise], default: raise, when: {a: ["on"], b: ["off"]}}
"""


def _study_with_best(tmp_path, sqlite_url, name, text, pick):
    """A real search of ``text``, then the best set to the first successful trial whose params satisfy ``pick``."""
    space = tmp_path / f"{name}.yaml"
    space.write_text(text)
    run_search(
        SearchOptions(
            budget_s=120,
            storage_url=sqlite_url,
            study=name,
            space_path=str(space),
            out_dir=str(tmp_path / "o"),
            hardware=Hardware(),
            n_trials=24,
            seed=1,
            confirm_top=0,
        )
    )
    repo = Repo(sqlite_url)
    run = repo.get_run(name)
    chosen = [t for t in repo.list_trials(run.id, outcome="ok") if pick(t.params)]
    assert chosen, "the search never ran the configuration this test needs; change the seed"
    repo.set_best(run.id, chosen[0].number, chosen[0].value)
    return repo, run


def test_each_change_alone_on_the_baseline_follows_conditions_and_ranks_failures_last(
    tmp_path, sqlite_url, monkeypatch
):
    import tuner.execution.isolation

    repo, run = _study_with_best(
        tmp_path, sqlite_url, "c", COND_SPACE, lambda p: p == {"x": 4, "a": "on", "k": 3, "b": "on"}
    )
    base = repo.baseline_trial(run.id)
    assert base.params == {"x": 0, "a": "off", "b": "off"}
    stored = {int(m.level[2:]): m.value for m in base.measurements if m.metric == "tok_s"}
    assert set(stored) == {1, 4}
    jobs, real = [], tuner.execution.isolation.run_trial
    monkeypatch.setattr(tuner.execution.isolation, "run_trial", lambda job: jobs.append(dict(job.params)) or real(job))
    ab = ablate(sqlite_url, "c")

    # the baseline and the best re-run first (ratios side by side), then forward and backward per changed
    # parameter; k is inactive in the baseline and follows a
    assert jobs[:2] == [base.params, {"x": 4, "a": "on", "k": 3, "b": "on"}]
    assert jobs[2:] == [
        {"x": 4, "a": "off", "b": "off"},
        {"x": 0, "a": "on", "k": 3, "b": "on"},
        {"x": 0, "a": "on", "k": 3, "mode": "raise", "b": "off"},
        {"x": 4, "a": "off", "b": "on"},
        {"x": 0, "a": "off", "b": "on"},
        {"x": 4, "a": "on", "k": 3, "mode": "raise", "b": "off"},
    ]
    assert ab.baseline_by_level == stored  # the fake target is deterministic: the re-run equals the stored run
    assert any("baseline re-run in this ablation" in n for n in ab.notes)
    alone = {r["param"]: r for r in ab.alone}
    assert set(alone) == {"x", "a", "b"}  # k is no row of its own
    x = alone["x"]
    assert (x["from"], x["to"], x["outcome"]) == (0, 4, "ok")
    for c in (1, 4):  # against the baseline's stored values: (10 + 5 * 4) / 10
        assert x["gain"][c] == x["by_level"][c] / stored[c]
        assert abs(x["gain"][c] - 3.0) < 1e-9
        assert abs(alone["b"]["gain"][c] - 1.0) < 1e-9
    assert alone["a"]["outcome"] != "ok" and alone["a"]["gain"] == {}
    assert [r["param"] for r in ab.alone] == ["x", "b", "a"]  # failed alone: worth nothing, last
    assert ab.ablation[0]["param"] == "b" and ab.ablation[0]["outcome"] != "ok"  # backward: a failed undo first
    assert [r["param"] for r in ab.ablation][1:] == ["x", "a"]

    text = ab.markdown()
    new = text.index(
        "## What each change is worth alone: the baseline with only that parameter set to the best's value"
    )
    assert new < text.index("put back to its baseline value")
    assert "| parameter | baseline → best value | c=1 x faster | c=4 x faster |" in text
    assert "| x | 0 → 4 | 3.00 | 3.00 |" in text
    assert f"| a | off → on | {alone['a']['outcome']} | {alone['a']['outcome']} |" in text
    assert (
        "At c=4 the largest single change is `x` (3.00x alone on the baseline); the costliest to undo from "
        f"the best is `b` (the best without it fails: {ab.ablation[0]['outcome']})."
    ) in text

    jobs.clear()
    only = ablate(sqlite_url, "c", views=("alone",))
    assert len(jobs) == 1 + 3 and not only.ablation and len(only.alone) == 3  # the baseline re-run, the changes
    assert "At c=1 the largest single change is `x` (3.00x alone on the baseline)." in only.markdown()


MIN_SPACE = (
    FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]")
    .replace("objective: {metric: tok_s,", "objective: {metric: tok_s, direction: minimize,")
    .replace("values: [0, 1, 2, 3, 4, 5, 6, 7]\n    default: 0", "values: [0, 1, 2, 3, 4, 5, 6, 7]\n    default: 7")
)


def test_a_helpful_change_is_worth_more_than_1x_when_the_objective_is_minimized(tmp_path, sqlite_url):
    assert "direction: minimize" in MIN_SPACE and "default: 7" in MIN_SPACE
    _study_with_best(tmp_path, sqlite_url, "m", MIN_SPACE, lambda p: p["x"] == 2)
    ab = ablate(sqlite_url, "m")
    want = (10.0 + 5 * 7) / (10.0 + 5 * 2)  # smaller is better: the baseline's 45 against the best's 20
    for rows, ratio in ((ab.alone, "gain"), (ab.ablation, "loss")):
        (row,) = rows
        assert (row["param"], row["from"], row["to"]) == ("x", 7, 2)
        assert set(row[ratio]) == {1, 4}
        assert all(abs(v - want) < 1e-9 for v in row[ratio].values()), row


def test_bad_ablate_views_is_one_line_naming_the_option_the_value_and_the_choices(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "tuner", "explain", "--ablate", "--ablate-views", "alone,bogus"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in ("--ablate-views", "alone,bogus", "alone, undo"):
        assert needle in lines[0], lines[0]
    assert not (tmp_path / "tuner.db").exists()  # refused before opening anything


def test_changes_that_remove_the_same_cost_are_named_as_overlapping():
    """Two fixes of one cost (a fused indexer, a context cap): each worth ~9x alone, each cheap to undo from a best
    that has the other; a change worth little alone is not named."""
    from tuner.explain import Explanation

    def row(param, key, value):
        return {"param": param, "from": 0, "to": 1, "outcome": "ok", "by_level": {}, key: {64: value}}

    ex = Explanation(study="s", baseline_by_level={64: 94.4}, best_by_level={64: 1804.0})
    ex.alone = [
        row("indexer_impl", "gain", 9.45),
        row("context_length", "gain", 8.40),
        row("glue", "gain", 1.01),
        row("attention_impl", "gain", 2.0),
    ]
    ex.ablation = [
        row("indexer_impl", "loss", 1.55),
        row("context_length", "loss", 1.17),
        row("glue", "loss", 1.12),
        row("attention_impl", "loss", 1.9),
    ]
    text = ex._summary(64)
    assert text.startswith("At c=64 the largest single change is `indexer_impl` (9.45x alone on the baseline)")
    tail = text.split("Overlapping changes")[1]
    assert "`indexer_impl` 9.45x alone vs 1.55x to undo" in tail and "`context_length` 8.40x alone vs 1.17x" in tail
    assert "glue" not in tail and "attention_impl" not in tail  # 1.01x alone; 1.9x to undo > sqrt(2.0)
    ex.ablation = [row("indexer_impl", "loss", 9.0), row("context_length", "loss", 8.0)]
    assert "Overlapping" not in ex._summary(64)


def test_explain_profiles_say_which_stage_each_step_spends_its_time_in(tmp_path, sqlite_url):
    """The built-in tiny decode workload on CPU: both profiles carry the share of each stage of the step, and the
    report gives them in a sentence, largest first (which stage leads is timing, tested in test_workload_model).
    The search times one step per level, no warmup: the profiles, not the trials' timings, are under test."""
    run_search(
        SearchOptions(
            budget_s=120,
            storage_url=sqlite_url,
            study="w",
            space_path="dsv4_flash_tiny",
            out_dir=str(tmp_path / "o"),
            hardware=Hardware(),
            n_trials=3,
            seed=1,
            confirm_top=0,
            settings={"warmup": 0, "repeats": 1},
        )
    )
    ex = explain(sqlite_url, "w", level=1)
    for name in ("baseline", "best"):
        stages = ex.profiles[name]["stages"]
        assert {r["stage"] for r in stages} == {"glue", "mhc", "attention", "indexer", "moe"}, stages
        assert [r["share"] for r in stages] == sorted((r["share"] for r in stages), reverse=True)
        first = stages[0]["stage"]
        assert f"Where the {name}'s step goes, by stage: {first} " in ex.markdown()


def test_the_report_opens_with_its_answer_before_the_importances():
    """The measured ranking and where each step goes come first ("In short"), before the rough importances."""
    from tuner.explain import Explanation

    def row(param, key, value):
        return {"param": param, "from": 0, "to": 1, "outcome": "ok", "by_level": {}, key: {64: value}}

    prof = {
        "batch": 64,
        "device": "cuda",
        "total_us": 678880.0,
        "launches": 6485,
        "top": [],
        "stages": [{"stage": "indexer", "share": 0.918}, {"stage": "moe", "share": 0.038}],
    }
    ex = Explanation(
        study="s",
        importances={"objective": {"attention_impl": 0.4, "context_length": 0.05}},
        importance_trials=47,
        baseline_params={"context_length": 1048576},
        best_params={"context_length": 8192},
        baseline_by_level={64: 94.9},
        best_by_level={64: 1829.0},
        profiles={"baseline": prof},
    )
    ex.alone = [row("context_length", "gain", 10.33), row("indexer_impl", "gain", 7.10)]
    ex.ablation = [row("attention_impl", "loss", 1.52), row("context_length", "loss", 1.38)]
    text = ex.markdown()
    short = text.index("## In short")
    assert short < text.index("## Parameter importances")
    head = text[short : text.index("## Parameter importances")]
    assert "At c=64 the largest single change is `context_length` (10.33x alone on the baseline)" in head
    assert "the costliest to undo from the best is `attention_impl` (1.52x)" in head
    assert "Profiled: the baseline's step spends 91.8% in the indexer stage (678.88 ms at batch 64)." in head
    assert text.count("the largest single change") == 1
    ex.alone, ex.ablation = [], []
    assert "`--ablate` measures what each change is worth" in ex.markdown().split("## Parameter importances")[0]
