"""The same search on a real PostgreSQL (started by .ci/run; skipped with the reason when absent)."""

import os
import uuid

import optuna
import pytest
from spaces import FAKE_SPACE

from search_spaces import Hardware
from storage import Repo
from tuner.search.context import SearchOptions
from tuner.search.driver import run_search

PG = os.environ.get("TUNER_TEST_POSTGRES_URL")
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(not PG, reason="TUNER_TEST_POSTGRES_URL is not set (.ci/run starts PostgreSQL)"),
]


def test_search_on_postgres_with_resume(tmp_path):
    space = tmp_path / "s.yaml"
    space.write_text(FAKE_SPACE)  # the failing values (crash, hang, oom, raise) come after an ok baseline
    study = f"pg-{uuid.uuid4().hex[:8]}"
    opts = dict(
        budget_s=60,
        storage_url=PG,
        study=study,
        space_path=str(space),
        out_dir=str(tmp_path / "o"),
        hardware=Hardware(),
        seed=2,
        trial_timeout_s=2.0,
        confirm_top=0,
    )
    res = run_search(SearchOptions(n_trials=6, **opts))
    assert res.trials[0].outcome == "ok" and res.trials[0].is_baseline and len(res.trials) == 6
    res2 = run_search(SearchOptions(n_trials=3, resume=True, **opts))
    assert len(res2.trials) == 9
    repo = Repo(PG)
    run = repo.get_run(study)
    assert repo.count_trials(run.id) == 9
    assert (
        optuna.load_study(study_name=study, storage=PG.replace("postgresql://", "postgresql+psycopg://"))
        .trials[-1]
        .number
        == 8
    )
