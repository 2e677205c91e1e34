"""The load generator's figures against the stand-in's known rates, and the command target's preflight."""

from __future__ import annotations

import json
import time

import pytest

from tests.server.conftest import assert_gone, standin_command
from tuner.targets.server import loadgen
from tuner.targets.server.launch import ServerProcess, pick_free_port


@pytest.fixture(scope="module")
def standin():
    port = pick_free_port(33000, 33999)
    argv = [
        a.replace("{host}", "127.0.0.1").replace("{port}", str(port)).replace("{model}", "m") for a in standin_command()
    ] + ["--tokens-per-second", "50", "--ttft-ms", "100"]
    server = ServerProcess(argv, port=port)
    assert server.wait_ready(time.time() + 20) is None
    yield server
    server.stop()
    assert_gone(server.pgid, port)


def test_rates_latencies_and_throughput(standin):
    cfg = loadgen.LoadConfig(model="m", output_len=11, requests_per_level=6, prompt_len=4)
    res = loadgen.run_level(standin.base_url, cfg, 3)
    s = loadgen.level_summary(res)
    assert res.errors == 0 and len(res.ok_requests) == 6
    # TTFT includes one HTTP connection set-up: never below the server's 100 ms; above it by what a busy box adds,
    # so the upper bound is read off this level's own clock: two rounds of 3 requests, each round a first token and
    # then 10 gaps, so TTFT <= half the wall time less the gaps (half of them here: slack); one counted from the level's
    # start (250 ms at p50), or not before the request's end, is mismeasured
    bound = 1000 * res.wall_s / 2 - 5 * s["itl_ms_mean"]
    assert 100 <= s["ttft_ms_p50"] <= bound, (s["ttft_ms_p50"], res.wall_s, s["itl_ms_mean"])
    assert all(r.ttft_s < r.e2e_s for r in res.ok_requests), [(r.ttft_s, r.e2e_s) for r in res.ok_requests]
    assert s["itl_ms_mean"] == pytest.approx(20, rel=0.15)
    assert s["tok_s_per_request"] == pytest.approx(50, rel=0.15)
    # 3 in flight, each 100 ms + 10 gaps of 20 ms: two rounds of 0.3 s for 66 tokens
    assert s["tok_s"] == pytest.approx(66 / 0.6, rel=0.2)
    assert s["req_s"] == pytest.approx(6 / 0.6, rel=0.2)
    rows = {(r.metric, r.level) for r in loadgen.level_metrics(res)}
    assert {("tok_s", "c=3"), ("ttft_ms_p99", "c=3"), ("itl_ms_p50", "c=3"), ("e2e_ms_mean", "c=3")} <= rows


def test_chat_api_dataset_and_jitter(standin, tmp_path):
    data = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "hi", "max_tokens": 3}, {"messages": [{"role": "user", "content": "yo"}], "output_len": 5}]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = loadgen.LoadConfig.from_settings({"model": "m", "api": "chat", "dataset": str(data), "requests_per_level": 4})
    res = loadgen.run_level(standin.base_url, cfg, 2)
    assert sorted(r.output_tokens for r in res.ok_requests) == [3, 3, 5, 5]
    jit = loadgen.make_requests(loadgen.LoadConfig(prompt_len=100, output_len=100, length_jitter=0.5), 50)
    lens = [r.max_tokens for r in jit]
    assert 50 <= min(lens) < 80 and 120 < max(lens) <= 150


def test_errors_are_counted_not_raised():
    cfg = loadgen.LoadConfig(requests_per_level=2, request_timeout_s=2)
    res = loadgen.run_level(f"http://127.0.0.1:{pick_free_port(34000, 34999)}", cfg, 2)
    assert res.errors == 2 and loadgen.level_summary(res)["error_rate"] == 1.0


def test_bad_dataset_names_the_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(ValueError, match="d.jsonl:2"):
        loadgen.load_dataset(str(p))


BAD_SPACE = """
name: bad
target: command
params:
  kv: {type: categorical, values: [auto, fp9], default: auto, flag: --kv-cache-dtype}
  tps: {type: categorical, values: [10, 20], default: 10, flag: --tokens-per-secnd}
  buckets: {type: buckets, max_bs: [8], densities: [pow2], default: "pow2:8", flag: --cuda-graph-bs-decode}
"""


def test_command_preflight_reads_help_of_the_standin(make_target):
    report = make_target().preflight()
    assert report.ok, "\n".join(report.lines())
    assert "4 of 4 flags accepted" in "\n".join(report.lines())
    bad = make_target(yaml=BAD_SPACE).preflight()
    text = "\n".join(bad.lines())
    assert "did you mean --tokens-per-second?" in text
    assert "'fp9' is not one of the choices of --kv-cache-dtype" in text
    assert not bad.ok


def test_check_refuses_by_named_rule(make_target):
    t = make_target(extra_args=["--enable-torch-compile", "--torch-compile-max-bs", "64"])
    reason = t.check({"context_length": 8192, "kv_cache_dtype": "auto", "buckets": "pow2:8", "fast_path": False})
    assert reason and "torch-compile-bs-above-cuda-graph-bs" in reason
