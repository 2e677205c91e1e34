"""The Pareto front exists once (``storage.front``), for ``tuner best --pareto``/``export`` and the dashboard alike:
over trials stored in a real database, a load whose figures are not finite is no point, and the front is ordered
along its curve (highest throughput first, which is the lowest per-user speed first)."""

from __future__ import annotations

import math

import api.front
import storage.front
import tuner.targets.server.front as tuner_front
from storage import Repo
from storage.types import MetricRow

# (trial, load, tok/s in all, tok/s per user): 0@r=1 is dominated by 1@r=1; 1@r=4's per-user speed was cut short
LOADS = [
    (0, "r=1", 90.0, 20.0),
    (0, "r=2", 170.0, 15.0),
    (1, "r=1", 100.0, 21.0),
    (1, "r=3", 240.0, 12.0),
    (1, "r=4", 300.0, math.inf),
    (2, "r=2", 200.0, 9.0),
]


def _trials(tmp_path):
    repo = Repo(f"sqlite:///{tmp_path / 'front.db'}")
    repo.create_schema()
    run = repo.create_run("f", target="command", budget_s=60)
    for number in sorted({t for t, *_ in LOADS}):
        repo.start_trial(run.id, number, {"slots": number})
        rows = [MetricRow("gpus", storage.front.GOODPUT_LEVEL, 2.0, "count")]
        for t, load, tok, user in LOADS:
            if t == number:
                rows += [
                    MetricRow("tok_s", load, tok, "tok/s"),
                    MetricRow("tok_s_per_request", load, user, "tok/s"),
                    MetricRow("meets_slo", load, 1.0, "flag"),
                ]
        repo.finish_trial(run.id, number, outcome="ok", value=1.0, metrics=rows)
    return repo.list_trials(run.id, with_measurements=True)


def test_the_front_is_one_function_for_the_tuner_and_the_api():
    assert tuner_front.pareto_front is api.front.pareto_front is storage.front.pareto_front
    assert tuner_front.operating_points is api.front.operating_points is storage.front.operating_points


def test_a_load_with_a_figure_that_is_not_finite_is_no_point(tmp_path):
    names = [p.name for p in storage.front.operating_points(_trials(tmp_path))]
    assert "1@r=4" not in names and len(names) == len(LOADS) - 1


def test_the_front_is_ordered_by_throughput_falling_and_per_user_speed_rising(tmp_path):
    front = storage.front.pareto_front(storage.front.operating_points(_trials(tmp_path)))
    assert [p.name for p in front] == ["1@r=3", "0@r=2", "1@r=1"]  # 2@r=2 and 0@r=1 are dominated
    assert [p.tok_s_per_gpu for p in front] == [120.0, 85.0, 50.0]  # per GPU: 2 GPUs
    speeds = [p.tok_s_per_request for p in front]
    assert speeds == sorted(speeds)
