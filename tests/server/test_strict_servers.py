"""A strict OpenAI server (one that answers HTTP 422 to a request field it does not know, as ``transformers serve``
does to ``ignore_eos``): the first request learns what it accepts and the load adapts, or the trial ends as a
``request_error`` naming the field and the setting that fixes it. Also the time a trial spends where: start-up,
warm-up, the measurement window of each level."""

from __future__ import annotations

import time

import pytest

from tuner.measurement import Outcome
from tuner.targets.server import loadgen

DEFAULTS = {"context_length": 8192, "kv_cache_dtype": "auto", "buckets": "pow2:8", "fast_path": False}


def test_a_refused_ignore_eos_is_dropped_and_the_trial_measures(make_target):
    target = make_target(["--reject-field", "ignore_eos"], output_len=12)
    m = target.evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.OK, m.reason
    assert m.metric("ignore_eos") == 0.0
    assert m.metric("tok_s", "c=4") > 0


def test_ignore_eos_is_sent_to_a_server_that_accepts_it(make_target):
    m = make_target().evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.OK, m.reason
    assert m.metric("ignore_eos") == 1.0


def test_ignore_eos_set_true_on_a_strict_server_is_a_request_error_naming_the_setting(make_target):
    m = make_target(["--reject-field", "ignore_eos"], ignore_eos=True).evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.REQUEST_ERROR, m.reason
    assert "request field `ignore_eos`" in m.reason and "ignore_eos: false" in m.reason


def test_a_refused_extra_body_field_names_the_setting_to_fix(make_target):
    target = make_target(["--reject-field", "top_k"], extra_body={"top_k": 5})
    m = target.evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.REQUEST_ERROR, m.reason
    assert "remove `top_k` from setting `extra_body`" in m.reason


def test_a_request_error_is_never_remembered_as_a_failed_flag_set(make_target):
    target = make_target(["--reject-field", "top_k"], extra_body={"top_k": 5})
    assert target.evaluate(DEFAULTS, time.time() + 60).outcome is Outcome.REQUEST_ERROR
    assert target.check(DEFAULTS) is None


def test_a_trial_stores_its_startup_warmup_and_measurement_seconds(make_target):
    m = make_target(["--startup-delay", "0.3"]).evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.OK, m.reason
    assert m.metric("startup_s") >= 0.3
    assert 0 < m.metric("warmup_s") < m.duration_s
    assert m.metric("measure_s", "c=1") > 0 and m.metric("requests", "c=4") >= 4
    assert 0 < m.metric("teardown_s") < m.duration_s


@pytest.fixture
def fast_standin(make_target):
    from tests.server.conftest import standin_command
    from tuner.targets.server.launch import ServerProcess, pick_free_port

    port = pick_free_port(33000, 33999)
    argv = [
        a.replace("{host}", "127.0.0.1").replace("{port}", str(port)).replace("{model}", "m") for a in standin_command()
    ] + ["--tokens-per-second", "2000"]
    server = ServerProcess(argv, port=port)
    assert server.wait_ready(time.time() + 20) is None
    yield server
    server.stop()


def test_a_level_is_measured_for_level_s_seconds_on_a_fast_server(fast_standin):
    cfg = loadgen.LoadConfig(model="m", output_len=10, prompt_len=4, min_requests=4, level_s=1.0)
    res = loadgen.run_level(fast_standin.base_url, cfg, 2)
    assert res.wall_s >= 1.0 and len(res.requests) > 4 and res.errors == 0
    assert "short_window" not in {r.metric for r in loadgen.level_metrics(res)}


def test_a_level_measured_over_too_little_is_flagged(fast_standin):
    cfg = loadgen.LoadConfig(model="m", output_len=10, prompt_len=4, requests_per_level=4)
    res = loadgen.run_level(fast_standin.base_url, cfg, 2)
    assert len(res.requests) == 4 and res.wall_s < loadgen.SHORT_WINDOW_S
    rows = {(r.metric, r.level): r.value for r in loadgen.level_metrics(res)}
    assert rows[("short_window", "c=2")] == 1.0 and rows[("requests", "c=2")] == 4.0


def test_the_refused_field_is_read_from_the_error_texts_of_common_servers():
    body = {
        "model": "m",
        "prompt": "p",
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0.0,
    }
    texts = {
        'HTTP 422: {"detail":"Unexpected fields in the request: {\'ignore_eos\'}"}': "ignore_eos",  # transformers
        "HTTP 400: [{'type': 'extra_forbidden', 'loc': ('body', 'stream_options'), 'msg': 'Extra inputs are not "
        "permitted'}]": "stream_options",  # a pydantic model with extra='forbid'
        "HTTP 400: Unrecognized request argument supplied: ignore_eos": "ignore_eos",  # OpenAI's own wording
        "HTTP 404: The model `m2` does not exist.": "model",  # then the fix names served_model_name
        "HTTP 400: invalid value for temperature": "temperature",
    }
    for text, want in texts.items():
        assert loadgen._named_field(text, body) == want, text
