"""benchmarks/kernel_search_repeats.py on a real kernel search (a CPU fake kernel whose configs have twins)."""

from __future__ import annotations

from benchmark_scripts import benchmark_script

from search_spaces import Hardware
from storage import Repo
from tuner.search.context import SearchOptions
from tuner.search.kernel_search import KernelCase, tune_case


def test_repeats_report_reads_twins_and_runs_from_the_study_database(tmp_path, sqlite_url):
    """benchmarks/kernel_search_repeats.py on a real study: the twins TwinKernel's search did not run are counted
    apart from configs asked again, and the best is a trial that ran."""
    opts = SearchOptions(
        budget_s=120,
        storage_url=sqlite_url,
        out_dir=str(tmp_path / "out"),
        seed=3,
        hardware=Hardware(),
        settings={"allow_cpu_interpreter": True},
        confirm_top=0,
        n_trials=16,
    )
    tune_case(KernelCase("kernel_tuning_fakes:TwinKernel", {"batch": 1, "rows": 1}), opts, "twins")
    with benchmark_script("kernel_search_repeats") as script:
        rows = script.summarise(sqlite_url)
        text = script.report(rows, sqlite_url, None)
    (row,) = rows
    repo = Repo(sqlite_url)
    trials = repo.list_trials(repo.get_run("twins").id)
    assert row["trials"] == len(trials) and row["ran"] == sum(1 for t in trials if t.repeat_of is None)
    assert row["twin"] > 0 and row["same"] + row["twin"] == sum(1 for t in trials if t.repeat_of is not None)
    assert row["best_us"] == 40.0 and row["best_config"]["X"] == 3
    assert "| twins |" in text
