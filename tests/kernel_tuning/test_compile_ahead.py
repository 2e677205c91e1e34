"""Compile-ahead in the kernel search (CPU): trials asked ahead are handed to the compile helpers and run in the
order asked, each only after its compile finished; trials still waiting at the end are failed in Optuna as not run.

The helpers are replaced by a thread pool that records what it was given (the real helpers compile for a GPU: their
compile path is checked against the real Triton compiler in tests/kernels/test_kernels_compile_only.py)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import optuna
import pytest
import torch

from search_spaces import Hardware
from storage import Repo
from tuner.errors import SearchError
from tuner.execution.compile_ahead import MAX_HELPERS, default_helpers
from tuner.search.context import SearchOptions
from tuner.search.kernel_search import KernelCase, compile_helpers, tune_case

REPLAY = "kernel_tuning_fakes:ReplayKernel"


class RecordingAhead:
    """Same interface as tuner.execution.compile_ahead.CompileAhead; "compiling" takes 20 ms and is recorded."""

    def __init__(self, helpers: int) -> None:
        self.helpers = helpers
        self._pool = ThreadPoolExecutor(helpers)
        self.submitted: list[dict] = []
        self.compiled: list[str] = []
        self.lock = threading.Lock()

    def submit(self, kernel_name, shape, dtype, config, seed=0):
        self.submitted.append(dict(config))

        def work():
            time.sleep(0.02)
            with self.lock:
                self.compiled.append(json.dumps(config, sort_keys=True))

        return self._pool.submit(work)

    def wait(self, fut, timeout_s):
        fut.result(timeout=timeout_s)

    def close(self):
        self._pool.shutdown()


def test_trials_asked_ahead_are_compiled_first_and_leftovers_are_not_run(tmp_path):
    from kernel_tuning_fakes import ReplayKernel

    url = f"sqlite:///{tmp_path / 't.db'}"
    k = ReplayKernel.instance
    shape = k.shapes()[0]
    ahead = RecordingAhead(4)
    compiled_before_run = []

    class Watch:
        def started(self, ctx):
            pass

        def message(self, text):
            pass

        def trial_finished(self, summary, ctx):
            pass

        def trial_started(self, number, params):
            key = json.dumps({**k.default_config(shape), **params}, sort_keys=True)
            with ahead.lock:
                compiled_before_run.append(key in ahead.compiled)

    opts = SearchOptions(
        budget_s=120,
        storage_url=url,
        out_dir=str(tmp_path / "out"),
        seed=3,
        hardware=Hardware(),
        settings={"allow_cpu_interpreter": True},
        confirm_top=0,
        n_trials=9,
    )
    res = tune_case(KernelCase(REPLAY, shape), opts, "ahead", Watch(), ahead)
    ahead.close()
    repo = Repo(url)
    trials = repo.list_trials(repo.get_run("ahead").id)
    assert len(trials) == 9 and [t.number for t in trials] == list(range(9))  # run in the order asked
    assert trials[0].is_baseline and trials[0].params == k.default_config(shape)
    keys = [json.dumps(c, sort_keys=True) for c in ahead.submitted]
    assert len(keys) == len(set(keys))  # a config is compiled once
    assert all(k.check_config(c, shape) is None for c in ahead.submitted)  # rule-breakers cost no compile
    ran = [t for t in trials if t.outcome != "invalid_config" and "not run again" not in t.reason]
    assert ran and all(compiled_before_run[t.number] for t in ran)  # each waited for its own compile
    study = optuna.load_study(study_name="ahead", storage=url)
    assert study.sampler._constant_liar  # pending trials are kept apart
    assert not [t for t in study.trials if t.user_attrs.get("outcome") == "not_run"]  # a trial count is not overrun
    assert res.evaluated >= 1

    # ended by its time share instead: the trials asked ahead and never run are failed as not run, and only in Optuna
    ahead = RecordingAhead(4)
    tune_case(KernelCase(REPLAY, shape), dataclasses.replace(opts, n_trials=None, budget_s=4), "short", None, ahead)
    ahead.close()
    study = optuna.load_study(study_name="short", storage=url)
    left = [t for t in study.trials if t.user_attrs.get("outcome") == "not_run"]
    assert left and all(t.state == optuna.trial.TrialState.FAIL for t in left)
    recorded = {t.number for t in repo.list_trials(repo.get_run("short").id)}
    assert recorded and not {t.number for t in left} & recorded


def test_compile_helpers_setting():
    assert compile_helpers({}, 0) == 0  # no GPU: nothing to compile for
    assert compile_helpers({"compile_ahead": "auto"}, 1) == default_helpers(1)
    assert compile_helpers({"compile_ahead": "3"}, 1) == 3
    assert compile_helpers({"compile_ahead": False}, 1) == 0
    assert compile_helpers({"compile_ahead": "off"}, 1) == 0
    assert default_helpers(1, cpus=16) == MAX_HELPERS == 4 and default_helpers(1, cpus=4) == 2
    assert default_helpers(1, cpus=2) == 0 and default_helpers(0, cpus=64) == 0
    with pytest.raises(SearchError, match=r"setting `compile_ahead` must be .* but got 'lots'"):
        compile_helpers({"compile_ahead": "lots"}, 1)
    with pytest.raises(SearchError, match="got -2"):
        compile_helpers({"compile_ahead": -2}, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the helpers compile for the GPU's target: needs CUDA")
def test_helpers_fill_the_cache_that_the_trial_then_loads(tmp_path, monkeypatch):
    """Real helpers compile three indexer configs at a V4-Flash shape from meta tensors; a fresh process then runs
    and checks the same configs on real inputs and finds every binary in Triton's cache (none is added)."""
    import itertools

    from compile_check import assert_compiled_ahead_then_loaded

    from kernels.registry import get_kernel

    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    k = get_kernel("indexer")
    shape = k.shapes("v4flash")[0]
    configs = [{**k.default_config(shape), **c} for c in itertools.islice(k.configs(shape, "cuda", "bfloat16"), 3)]
    assert_compiled_ahead_then_loaded("indexer", shape, configs, cache)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the helpers compile for the GPU's target: needs CUDA")
def test_helpers_compile_the_sparse_decode_binaries_that_the_trial_then_loads(tmp_path, monkeypatch):
    """The sparse-decode launcher picks its prefetch and merge-launch paths by GPU; from the helpers' meta tensors
    it must pick the same, or every trial compiles again (issue 20's held-out sweep lost most configs so)."""
    import itertools

    from compile_check import assert_compiled_ahead_then_loaded

    from kernels.registry import get_kernel

    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    k = get_kernel("sparse_decode")
    shape = k.shapes("v4flash")[0]  # batch 1: split rows, so the merge kernel is launched too
    configs = [{**k.default_config(shape), **c} for c in itertools.islice(k.configs(shape, "cuda", "bfloat16"), 2)]
    assert_compiled_ahead_then_loaded("sparse_decode", shape, configs, cache)
