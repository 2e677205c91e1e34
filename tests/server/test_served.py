"""A level counts only what the server served (issue 43), against the stand-in server misbehaving as real servers
do: cancelling in-flight streams on a new request, ignoring ``ignore_eos``, streaming without usage, slow first
requests, a kill by a signal from outside; and the failed-flag memory keeping only failures that repeat."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.server.conftest import assert_gone, standin_command
from tests.server.test_launch import DEFAULTS, spy  # noqa: F401 - the fixture
from tuner.measurement import Outcome
from tuner.targets.server import loadgen
from tuner.targets.server.launch import ServerProcess, pick_free_port


def _standin(*args: str) -> ServerProcess:
    port = pick_free_port(35000, 35999)
    argv = [
        a.replace("{host}", "127.0.0.1").replace("{port}", str(port)).replace("{model}", "m") for a in standin_command()
    ] + list(args)
    server = ServerProcess(argv, port=port)
    assert server.wait_ready(time.time() + 20) is None
    return server


def test_a_server_cancelling_in_flight_streams_makes_the_level_request_error(make_target, spy):  # noqa: F811
    target = make_target(["--cancel-on-new", "--tokens-per-second", "200"], levels=[4], min_requests=8)
    m = target.evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.REQUEST_ERROR, (m.outcome, m.reason)
    assert m.reason.startswith("at c=4:") and "asked tokens delivered" in m.reason
    delivered = m.metric("delivered", "c=4")
    assert delivered is not None and delivered < 0.95
    assert m.metric("error_rate", "c=4") is not None and m.value is None


def test_a_server_ignoring_ignore_eos_is_said_and_its_short_completions_do_not_count(make_target, spy):  # noqa: F811
    target = make_target(["--ignore-eos-ignored", "5"], levels=[1], output_len=20)
    m = target.evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.REQUEST_ERROR, (m.outcome, m.reason)
    assert "25.0% of the asked tokens delivered" in m.reason
    assert m.metric("ignore_eos") == 0.0 and m.metric("length_honoured") == 0.0
    assert any("does not honour ignore_eos: asked 8 tokens, got 5" in n for n in m.data["notes"])


def test_a_server_honouring_ignore_eos_counts_every_asked_token(make_target, spy):  # noqa: F811
    m = make_target(["--tokens-per-second", "400"], levels=[2]).evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.OK, m.reason
    assert m.metric("ignore_eos") == 1.0 and m.metric("length_honoured") == 1.0
    assert m.metric("delivered", "c=2") == 1.0 and m.metric("error_rate", "c=2") == 0.0
    assert m.metric("count:usage", "c=2") == 1.0


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory):
    """A real tokenizer (``tokenizers`` + ``transformers``) in which the stand-in's word ``tok`` is one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "tok": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tokenizer")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(path)
    return str(path)


def test_a_stream_without_usage_is_counted_by_the_model_tokenizer_not_by_chunks(word_tokenizer):
    server = _standin("--no-usage", "--tokens-per-chunk", "2", "--tokens-per-second", "400")
    try:
        # the model's tokenizer: the setting `model` (a path here; the requests name `served_model_name`)
        cfg = loadgen.LoadConfig.from_settings(
            {
                "model": word_tokenizer,
                "served_model_name": "m",
                "output_len": 20,
                "prompt_len": 4,
                "requests_per_level": 4,
            }
        )
        p = loadgen.probe(server.base_url, cfg)
        res = loadgen.run_level(server.base_url, p.config, 2)
        # 20 tokens in 10 chunks of 2: the count is the tokens, never the chunks
        assert [r.output_tokens for r in res.requests] == [20] * 4
        assert not p.refused and not p.ignored, (p.refused, p.ignored)
        assert any("tokens counted by the tokenizer" in a for a in p.adapted)
        assert res.count_source == "tokenizer" and res.delivered == 1.0
        rows = {(r.metric, r.level) for r in loadgen.level_metrics(res)}
        assert ("count:tokenizer", "c=2") in rows
    finally:
        server.stop()
        assert_gone(server.pgid, server.port)


def test_a_stream_without_usage_and_without_a_tokenizer_is_refused_naming_the_setting(tmp_path):
    server = _standin("--no-usage", "--tokens-per-chunk", "2")  # chunks of two tokens: no one-per-chunk count
    try:
        p = loadgen.probe(
            server.base_url, loadgen.LoadConfig(model="m", output_len=20, tokenizer=str(tmp_path / "none"))
        )
        assert "streams no token counts" in p.refused and "set `tokenizer`" in p.refused
    finally:
        server.stop()
        assert_gone(server.pgid, server.port)


def test_warm_up_runs_until_the_time_to_first_token_settles(make_target, spy):  # noqa: F811
    target = make_target(
        ["--slow-first", "6", "--slow-first-ms", "400", "--tokens-per-second", "400"], levels=[1], min_requests=4
    )
    m = target.evaluate(DEFAULTS, time.time() + 60)
    assert m.outcome is Outcome.OK, m.reason
    assert m.metric("ttft_ms_p99", "c=1") < 100
    assert m.metric("warmup_requests") >= 7  # the six slow ones and the settling after them


def test_ttft_settled_waits_for_the_falling_times_to_stop_falling():
    assert not loadgen.ttft_settled([434, 300, 250, 180, 120, 72])
    assert not loadgen.ttft_settled([120, 72, 30, 20, 15, 9])
    assert loadgen.ttft_settled([9, 30, 12, 20, 7, 15])
    assert not loadgen.ttft_settled([9, 30, 12])  # two windows at least


def test_a_kill_by_signal_is_a_crash_naming_the_signal_not_oom():
    server = _standin()
    try:
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        f = server.failure()
        assert f is not None and f.outcome is Outcome.CRASH, f
        assert "killed by signal 9" in f.reason and "OOM" not in f.reason
    finally:
        server.stop()
        assert_gone(server.pgid, server.port)


def test_the_failed_flag_memory_keeps_repeating_start_failures_of_this_study_only(make_target, spy, tmp_path):  # noqa: F811
    from storage import Repo

    repo = Repo(f"sqlite:///{tmp_path / 'memory.db'}")
    repo.create_schema()
    one, two = (repo.create_run(name, target="command", budget_s=60) for name in ("one", "two"))
    target = make_target(["--oom-at-start"])
    first = target.evaluate(DEFAULTS, time.time() + 30)
    assert first.outcome is Outcome.OOM
    target.remember_failure(repo, one.id, 1, DEFAULTS, first)
    assert target.known_failure(repo, DEFAULTS, run_id=one.id) is None  # once may be chance
    second = target.evaluate(DEFAULTS, time.time() + 30)
    assert second.outcome is Outcome.OOM
    target.remember_failure(repo, one.id, 2, DEFAULTS, second)
    reason = target.known_failure(repo, DEFAULTS, run_id=one.id)
    assert reason and "failed at start 2 times" in reason and "trial 2, oom" in reason
    # another study in the same storage is not refused, unless the user asks for the storage's memory
    assert target.known_failure(repo, DEFAULTS, run_id=two.id) is None
    assert make_target(["--oom-at-start"], failed_scope="storage").known_failure(repo, DEFAULTS, run_id=two.id)
    # a failure after the server was ready is never kept
    crash = make_target(["--crash-after", "0.2", "--tokens-per-second", "20"], output_len=50)
    m = crash.evaluate(DEFAULTS, time.time() + 30)
    assert m.outcome is Outcome.CRASH, m.reason
    for n in (3, 4):
        crash.remember_failure(repo, one.id, n, DEFAULTS, m)
    assert crash.known_failure(repo, DEFAULTS, run_id=one.id) is None


def test_verify_of_a_server_cancelling_in_flight_streams_is_request_error_not_a_figure(make_target, tmp_path):
    from tuner.export.script import recorded_figures, render_script
    from tuner.targets.server.verify import verify_script

    target = make_target(["--cancel-on-new", "--tokens-per-second", "200"], levels=[4], min_requests=8)
    script = tmp_path / "launch.sh"
    script.write_text(
        render_script(
            target.launch_spec(DEFAULTS),
            header=[],
            recorded=recorded_figures(target.objective(), 100.0, {4: 100.0}, target.settings),
        )
    )
    r = verify_script(script, port_range="32000-32999", timeout_s=60)
    assert r.outcome is Outcome.REQUEST_ERROR and not r.ok, "\n".join(r.lines())
    assert r.reason.startswith("at c=4:") and "asked tokens delivered" in r.reason
