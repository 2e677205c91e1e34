"""Load shapes: fixed, a distribution of lengths (mean and spread), a replayed JSONL request file; each refused in one
line when its settings contradict, recorded with the trial, and kept in the export's recorded load."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from tuner.errors import SettingsError
from tuner.measurement import Outcome
from tuner.targets.server import loadgen
from tuner.targets.server.loadshape import LoadShape


def _cfg(**settings) -> loadgen.LoadConfig:
    return loadgen.LoadConfig.from_settings({"model": "m", **settings})


@pytest.mark.parametrize("dist", ["lognormal", "normal"])
def test_a_distribution_draws_lengths_of_the_mean_and_spread_asked(dist):
    cfg = _cfg(prompt_len=200, output_len=100, prompt_len_std=50, output_len_std=40, length_distribution=dist)
    assert cfg.shape.kind == "distribution"
    reqs = loadgen.make_requests(cfg, 6000)
    out = [r.max_tokens for r in reqs]
    words = [len(r.prompt.split()) for r in reqs]
    assert statistics.fmean(out) == pytest.approx(100, rel=0.03) and statistics.pstdev(out) == pytest.approx(
        40, rel=0.06
    )
    assert statistics.fmean(words) == pytest.approx(200, rel=0.03) and statistics.pstdev(words) == pytest.approx(
        50, rel=0.06
    )
    assert min(out) >= 1
    skew = statistics.fmean([(x - 100) ** 3 for x in out]) / 40**3
    assert (skew > 0.5) if dist == "lognormal" else (abs(skew) < 0.3)  # lognormal: a long tail of long outputs
    assert loadgen.make_requests(cfg, 50) == reqs[:50]  # seeded: the same load for every trial


def test_fixed_lengths_are_the_default_shape_and_unchanged_by_shapes():
    cfg = _cfg(prompt_len=12, output_len=7)
    assert cfg.shape.kind == "fixed"
    assert {(len(r.prompt.split()), r.max_tokens) for r in loadgen.make_requests(cfg, 20)} == {(12, 7)}
    # the same requests as the load made before it had shapes (a LoadConfig built without settings has none)
    old = loadgen.LoadConfig(model="m", prompt_len=12, output_len=7, length_jitter=0.3)
    assert loadgen.make_requests(_cfg(prompt_len=12, output_len=7, length_jitter=0.3), 30) == loadgen.make_requests(
        old, 30
    )


def test_a_replayed_file_gives_its_prompts_and_lengths_in_order_cycled(tmp_path):
    data = tmp_path / "reqs.jsonl"
    rows = [
        {"prompt": "hello there", "output_len": 3},
        {"prompt_len": 5, "output_length": 9},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        {"input_length": 2},
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = _cfg(dataset=str(data), output_len=11)
    assert cfg.shape.kind == "replay"
    reqs = loadgen.make_requests(cfg, 6)
    assert [r.max_tokens for r in reqs] == [3, 9, 4, 11, 3, 9]
    assert reqs[0].prompt == "hello there" and len(reqs[1].prompt.split()) == 5
    assert reqs[2].prompt == [{"role": "user", "content": "hi"}] and len(reqs[3].prompt.split()) == 2
    rows_out = {r.metric: r.value for r in cfg.shape.rows(0)}
    assert rows_out["dataset_rows"] == 4 and rows_out["output_len_mean"] == pytest.approx((3 + 9 + 4 + 11) / 4)


@pytest.mark.parametrize(
    "settings, says",
    [
        ({"load_shape": "replay"}, "setting `load_shape: replay` needs setting `dataset`"),
        ({"load_shape": "fixed", "output_len_std": 3}, "shape a `distribution` load, but `load_shape` is 'fixed'"),
        ({"load_shape": "distribution", "length_jitter": 0.2}, "both spread the lengths"),
        ({"load_shape": "fixed", "dataset": "x.jsonl"}, "is a replayed load, but `load_shape` is 'fixed'"),
        ({"dataset": "/nonexistent/reqs.jsonl"}, "setting `dataset`: cannot read '/nonexistent/reqs.jsonl'"),
    ],
)
def test_contradicting_shape_settings_are_one_line(settings, says):
    with pytest.raises(SettingsError) as err:
        _cfg(**settings)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_bad_row_names_the_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "a"}\n{"prompt": "b", "output_len": 0}\n')
    with pytest.raises(SettingsError, match=r"d.jsonl:2: `output_len` must be a positive integer"):
        _cfg(dataset=str(p))
    q = tmp_path / "e.jsonl"
    q.write_text('{"output_len": 4}\n')
    with pytest.raises(SettingsError, match=r"e.jsonl:1: a row needs `prompt`, `messages` or a prompt length"):
        _cfg(dataset=str(q))


def test_the_dry_run_names_the_shape_and_refuses_a_bad_file_before_any_trial(make_target, tmp_path):
    report = make_target(load_shape="distribution", output_len_std=5).preflight()
    assert report.ok and report.facts["load shape"] == "lognormal lengths: prompt 8±0, output 20±5", report.lines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    report = make_target(dataset=str(bad)).preflight()
    assert not report.ok and any("bad.jsonl:1: not a JSON line" in e for e in report.errors)


def test_a_trial_records_its_shape_and_sends_it(make_target):
    t = make_target(
        load_shape="distribution",
        output_len=12,
        output_len_std=4,
        length_distribution="normal",
        levels=[2],
        min_requests=24,
    )
    m = t.evaluate(t.resolved.defaults(), time.time() + 60)
    assert m.outcome is Outcome.OK, m.reason
    assert m.metric("output_len_mean", "load:distribution") == pytest.approx(12, rel=0.05)
    assert m.metric("output_len_std", "load:distribution") == pytest.approx(4, rel=0.1)
    # the stand-in streams max_tokens tokens: the tokens received follow the shape (not 12 each)
    tok = m.metric("tok_s", "c=2") / m.metric("req_s", "c=2")
    assert tok == pytest.approx(12, rel=0.25)


def test_the_export_keeps_the_shape_in_its_recorded_load(tmp_path):
    from tests.server.test_search_on_standin import _search
    from tuner.figures.verification import read_recorded

    result, _ = _search(
        tmp_path, n_trials=1, load_shape="distribution", prompt_len_std=2.0, length_distribution="normal"
    )
    rec = read_recorded(Path(result.export_dir) / "launch.sh")
    assert {k: rec["load"].get(k) for k in ("load_shape", "prompt_len_std", "length_distribution")} == {
        "load_shape": "distribution",
        "prompt_len_std": 2.0,
        "length_distribution": "normal",
    }


def test_a_shape_from_settings_with_no_spread_is_fixed_lengths_of_a_distribution():
    shape = LoadShape.from_settings({"load_shape": "distribution"}, 10, 5, 0.0)
    assert shape.requests(3, 0) == LoadShape(kind="distribution", prompt_len=10, output_len=5).requests(3, 0)
    assert {m for _, m in shape.requests(10, 0)} == {5}
