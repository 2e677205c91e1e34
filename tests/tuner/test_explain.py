"""tuner explain: importances per level and the ablation of the best configuration's changes."""

from spaces import FAKE_SPACE

from search_spaces import Hardware
from tuner.explain import ablate, explain
from tuner.search import SearchOptions, run_search

SPACE = FAKE_SPACE.replace("values: [ok, crash, hang, oom, raise]", "values: [ok]") + """
  y:
    type: categorical
    values: [a, b]
    default: a
"""


def test_explain_ranks_the_parameter_that_matters_and_ablation_measures_it(tmp_path, sqlite_url):
    space = tmp_path / "s.yaml"
    space.write_text(SPACE)
    res = run_search(SearchOptions(budget_s=120, storage_url=sqlite_url, study="e", space_path=str(space),
                                   out_dir=str(tmp_path / "o"), hardware=Hardware(), n_trials=12, seed=3,
                                   confirm_top=0))
    assert res.best_params["x"] > 0
    ex = explain(sqlite_url, "e", profile=False)
    imp = ex.importances["objective"]
    assert imp and next(iter(imp)) == "x"  # the fake's value depends on x only
    assert "tok/s at c=4" in ex.importances
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
    run_search(SearchOptions(budget_s=120, storage_url=sqlite_url, study="p", space_path=str(space),
                             out_dir=str(tmp_path / "o"), hardware=Hardware(), n_trials=10, seed=5, confirm_top=0))
    seen = []
    ab = ablate(sqlite_url, "p", on_row=lambda ex: seen.append([r["param"] for r in ex.ablation]))
    assert seen and [len(s) for s in seen] == list(range(1, len(ab.ablation) + 1))  # one call per re-run
    report = tmp_path / "why.md"
    r = CliRunner().invoke(app, ["explain", "--storage", sqlite_url, "--study", "p", "--no-profile", "--ablate",
                                 "--out", str(report)])
    assert r.exit_code == 0, r.output
    assert "put back to its baseline value" in report.read_text()
    assert not list(tmp_path.glob(".why.md.tmp"))  # written whole, through a temporary file
