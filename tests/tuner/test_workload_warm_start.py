"""Warm start: a twin study's best configurations, translated to a server space, run first on a real server
(the stand-in OpenAI-compatible server as a `command` target), then TPE; explain sets predicted against measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from search_spaces import Hardware, load_space, resolve
from storage import Repo
from tuner.errors import SearchError
from tuner.search.warm_start import WARM_ATTR, parse_source, translate

STANDIN = Path(__file__).resolve().parents[1] / "server" / "standin_server.py"

TWIN = """
name: twin
target: workload
preset: dsv4-flash-tiny
settings: {live_context: 128, warmup: 1, repeats: 2}  # the 128K cap's indexer scores 30x the rows of the 4K cap's
objective: {metric: tok_s, combine: geomean, levels: [16]}
params:
  context_length:
    type: categorical
    values: [4096, 131072]
    default: 131072
    server: {flag: --context-length}
"""

SERVER = f"""
name: standin-server
target: command
settings:
  command: [{sys.executable}, {STANDIN}, --host, "{{host}}", --port, "{{port}}", --model-path, "{{model}}",
            --tokens-per-second, "100"]
  model: standin
  port_range: 31000-31999
  prompt_len: 8
  output_len: 20
  min_requests: 4
  rounds: 1
  warmup_requests: 1
objective: {{metric: tok_s, combine: geomean, levels: [1, 16]}}
params:
  context_length:
    type: categorical
    values: [4096, 131072]
    default: 131072
    flag: --context-length
  fast_path:
    type: bool
    default: false
    flag: --enable-fast-path
"""


def tuner(*args, cwd):
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_translate_maps_twin_knobs_onto_the_sglang_space_by_flag():
    twin = load_space("dsv4_flash")
    server = resolve(load_space("sglang_dsv4_flash"), Hardware())
    params = {
        **twin.defaults(),
        "context_length": 131072,
        "cuda_graph_buckets": "pow2:64",
        "attention_impl": "mma",
        "sparse_num_splits": 4,
        "sparse_block_t": 64,
        "sparse_block_h": 16,
        "gemm_proj": "fp8",
    }
    wanted, notes = translate(twin, params, server)
    assert wanted == {
        "context_length": 131072,
        "cuda_graph_buckets": "pow2:64",
        "dsv4_attn_backend": "auto",
        "triton_num_kv_splits": 4,
        "kv_cache_dtype": "bf16",
    }
    assert translate(twin, {**params, "kv_cache_dtype": "fp8_e4m3"}, server)[0]["kv_cache_dtype"] == "fp8_e4m3"
    assert any("moe_impl" in n and "no parameter for --moe-runner-backend" in n for n in notes)
    wanted, notes = translate(twin, {**params, "attention_impl": "torch", "sparse_num_splits": 1}, server)
    assert wanted["dsv4_attn_backend"] == "auto"  # the server's own default: V4 decode attention is --dsv4-attn-backend
    assert "triton_num_kv_splits" not in wanted and any(
        "1 is not a value of `triton_num_kv_splits`" in n for n in notes
    )


def test_a_bad_warm_start_source_is_one_line():
    with pytest.raises(SearchError, match="--warm-start must be URL#STUDY, but got 'sqlite:///x.db'"):
        parse_source("sqlite:///x.db")


@pytest.mark.slow  # two searches end to end (a minute on 2 cores): the README's second test command runs it
def test_warm_start_runs_the_twins_best_first_on_the_server_then_tpe(tmp_path):
    (tmp_path / "twin.yaml").write_text(TWIN)
    (tmp_path / "server.yaml").write_text(SERVER)
    r = tuner(
        "search",
        "--space",
        "twin.yaml",
        "--budget",
        "4m",
        "--n-trials",
        "6",
        "--seed",
        "0",
        "--confirm-top",
        "0",
        "--refine-share",
        "0",
        "--storage",
        "sqlite:///twin.db",
        "--study",
        "twin",
        "-o",
        "out",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    twin_repo = Repo(f"sqlite:///{tmp_path / 'twin.db'}")
    twin_run = twin_repo.get_run("twin")
    ok = [t for t in twin_repo.list_trials(twin_run.id, outcome="ok") if t.repeat_of is None]
    twin_best = max(ok, key=lambda t: t.value)
    assert twin_best.params["context_length"] == 4096  # the twin times the small cap fastest
    # a wrong source is refused before anything is written
    bad = tuner(
        "search",
        "--space",
        "server.yaml",
        "--budget",
        "2m",
        "--storage",
        "sqlite:///srv.db",
        "--study",
        "nope",
        "--warm-start",
        "sqlite:///twin.db#absent",
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and "no study 'absent'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "srv.db").exists() or Repo(f"sqlite:///{tmp_path / 'srv.db'}").get_run("nope") is None

    r = tuner(
        "search",
        "--space",
        "server.yaml",
        "--budget",
        "4m",
        "--n-trials",
        "4",
        "--seed",
        "0",
        "--confirm-top",
        "0",
        "--refine-share",
        "0",
        "--storage",
        "sqlite:///srv.db",
        "--study",
        "srv",
        "-o",
        "out",
        "--warm-start",
        "sqlite:///twin.db#twin",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    study = optuna.load_study(study_name="srv", storage=f"sqlite:///{tmp_path / 'srv.db'}")
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    assert trials[0].user_attrs.get("tuner_baseline") and trials[0].params["context_length"] == 131072
    warm = trials[1]
    assert warm.user_attrs[WARM_ATTR]["trial"] == twin_best.number and warm.params["context_length"] == 4096
    assert all(WARM_ATTR not in t.user_attrs for t in trials[2:])  # then the sampler's own proposals
    repo = Repo(f"sqlite:///{tmp_path / 'srv.db'}")
    run = repo.get_run("srv")
    rec = {t.number: t for t in repo.list_trials(run.id)}
    assert rec[1].outcome == "ok" and rec[1].value > 1.5 * rec[0].value  # the stand-in halves its rate above 64K
    # explain sets the twin's prediction against the server's measurement
    r = tuner("explain", "--no-profile", "--storage", "sqlite:///srv.db", "--study", "srv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Predicted by the twin against measured on the server" in r.stdout
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("| 1 | twin#") and "c=16" in ln)
    measured = float(row.split("|")[5].strip().rstrip("x"))
    assert 1.5 < measured < 2.6, row
