"""The data of the API tests: a real small search, and a stand-in search with every kind of trial end.

``real_search`` runs ``tuner.search.run_search`` on the CPU space ``dsv4_flash_tiny`` (each trial a
subprocess). ``fake_search`` is an Optuna study on a stand-in objective that writes the ``tuner_`` tables
through ``storage.Repo`` as the search does, but deterministically includes an out-of-resources failure, a
pruned trial and artifacts with non-ASCII content, which a 6-trial real search rarely produces.
"""

from __future__ import annotations

import os
import socket
import time

import optuna

from storage import Repo
from storage.repo import MetricRow

TOKEN = "test-token-0123456789abcdef"
STUDY = "s1"
"""The real search."""
MIXED = "mixed"
"""The stand-in search."""
KERNEL_CONFIG = "kernel_configs/moe_fp8/E=256,N=512,device_name=NVIDIA_H200.json"
"""A kernel-config artifact of the stand-in search: its name holds ``/`` as the export writes them."""


def real_search(url: str, study: str, out_dir: str, *, n_trials: int = 5, budget_s: float = 240.0) -> None:
    """``tuner.search.run_search`` on the CPU space; no top-k confirmation, no warmup step and one timed step per
    level (the API tests read what a search stores, not how precisely it timed), to keep the tests short."""
    from tuner.search.context import SearchOptions
    from tuner.search.driver import run_search

    run_search(SearchOptions(budget_s=budget_s, storage_url=url, study=study, space_path="dsv4_flash_tiny",
                             target="workload", n_trials=n_trials, out_dir=out_dir, seed=0,
                             settings={"warmup": 0, "repeats": 1}, confirm_top=0))  # fmt: skip


def fake_search(url: str, study_name: str, *, n_trials: int = 12, seed: int = 0, delay_s: float = 0.0,
                end: bool = True, resume: bool = False, budget_s: float = 60.0) -> Repo:  # fmt: skip
    """A finite search on a stand-in objective: one baseline, ok trials, an out-of-resources one, a pruned one.
    With ``resume`` it continues the study as ``tuner search --resume`` does (``Repo.restart_run``)."""
    repo = Repo(url)
    repo.create_schema()
    sampler = optuna.samplers.TPESampler(seed=seed)
    if resume:
        run = repo.get_run(study_name)
        repo.restart_run(run.id, budget_s=budget_s, settings={"pid": os.getpid()})
        study = optuna.load_study(storage=url, study_name=study_name, sampler=sampler)
    else:
        run = repo.create_run(
            study_name, target="workload", budget_s=budget_s, objective="decode_tok_s", unit="tok/s",
            space_name="dsv4_flash_tiny", space_yaml="params: {}\n",
            environment={"gpu": "cpu", "torch": "2.13", "host": socket.gethostname()},
            settings={"pid": os.getpid(), "host": socket.gethostname()},
        )  # fmt: skip
        study = optuna.create_study(storage=url, study_name=study_name, direction="maximize", sampler=sampler)
        study.enqueue_trial({"split_k": 1, "block_n": 64, "context_cap": 1048576})

    def objective(trial: optuna.Trial) -> float:
        params = {
            "split_k": trial.suggest_categorical("split_k", [1, 2, 4, 8]),
            "block_n": trial.suggest_categorical("block_n", [32, 64, 128, 256]),
            "context_cap": trial.suggest_categorical("context_cap", [1048576, 131072, 16384]),
        }
        repo.start_trial(run.id, trial.number, params, worker="w0", is_baseline=trial.number == 0)
        time.sleep(delay_s)
        if trial.number == 5 or (params["split_k"] == 8 and params["block_n"] == 256):
            repo.finish_trial(run.id, trial.number, outcome="out_of_resources", value=None,
                              reason="shared memory 262144 > 232448", log_excerpt="triton OutOfResources",
                              duration_s=0.1)  # fmt: skip
            raise RuntimeError("out_of_resources")
        value = 30.0 * (1 + params["split_k"] ** 0.5) * (1048576 / params["context_cap"]) ** 0.5
        value *= 1.0 + params["block_n"] / 1024
        if trial.number == 3:
            repo.finish_trial(run.id, trial.number, outcome="pruned", value=None, reason="pruned at c=1",
                              metrics=[MetricRow("tok_s", "c=1", value / 4, "tok/s")], duration_s=0.2)  # fmt: skip
            raise optuna.TrialPruned()
        metrics = [MetricRow("tok_s", f"c={c}", value * c / 64, "tok/s") for c in (1, 16, 64)]
        metrics.append(MetricRow("step_ms", "", 1000.0 / value, "ms"))
        repo.finish_trial(run.id, trial.number, outcome="ok", value=value, metrics=metrics,
                          log_excerpt=f"trial {trial.number} ok", duration_s=0.5 + trial.number / 10)  # fmt: skip
        return value

    study.optimize(objective, n_trials=n_trials, catch=(RuntimeError,))
    best = study.best_trial
    script = "#!/usr/bin/env bash\npython -m sglang.launch_server " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in best.params.items()
    )
    repo.add_artifacts(run.id, [
        ("launch_script", "launch.sh", "out/launch.sh", script.encode()),
        ("best_params", "best_params.json", "out/best_params.json", b'{"split_k": 4}'),
        ("report", "report.md", "out/report.md", "# Report\n\nbest × 3.1 ✓\n".encode()),
        ("kernel_config", KERNEL_CONFIG, f"out/{KERNEL_CONFIG}", b'{"BLOCK_N": 64}'),
    ])  # fmt: skip
    if end:
        repo.end_run(run.id, "finished", export_dir="out")
    return repo
