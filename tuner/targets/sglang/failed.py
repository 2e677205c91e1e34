"""The memory of server launches that failed, kept in the study's storage (table ``tuner_failed_flags``), so no
study in that database spends a launch on the same flag set twice.

A launch is keyed by everything that makes it what it is: the server's version, its command (the port left out),
the environment, the flag arguments and the GPUs. Only failures a rerun would repeat are kept (a refused flag, an
OOM, a crash); a timeout, a pruned trial and a ``request_error`` (the load's fault, not the flags') never are.
The search never asks the memory about the baseline: every figure needs it measured.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

_logger = logging.getLogger(__name__)

REMEMBERED = ("invalid_config", "oom", "crash", "compile_error", "out_of_resources")
"""Outcomes that a rerun of the same flags would repeat; timeouts, pruned trials and request errors are not."""


def flag_set_key(command: Sequence[str], args: Sequence[str], env: dict[str, str], *, server_version: str = "",
                 gpus: str = "") -> str:
    """The key of one launch: a hash of the server's version, command, flags, environment and GPUs."""
    payload = json.dumps({"command": list(command), "args": list(args), "env": sorted(env.items()),
                          "server_version": server_version, "gpus": gpus})
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def known_failure(repo: Any, key: str) -> str | None:
    """Why the launch ``key`` is refused without running (it failed before in this database), or ``None``."""
    try:
        prior = repo.failed_flags(key)
    except Exception as exc:  # noqa: BLE001 - an older database without the table: nothing remembered there
        _logger.info("failed-flag memory unavailable: %s", str(exc).splitlines()[0])
        return None
    if prior is None:
        return None
    return (f"this exact flag set already failed (study run {prior.run_id}, trial {prior.trial_number}, "
            f"{prior.outcome}: {prior.reason[:200]}); set `allow_retry: true` to run it again")


def remember(repo: Any, run_id: int, number: int, *, key: str, outcome: str, reason: str, args: Sequence[str],
             server_version: str = "") -> bool:
    """Keep a failed launch (only :data:`REMEMBERED` outcomes, once per key); True when it was kept."""
    if outcome not in REMEMBERED:
        return False
    try:
        if repo.failed_flags(key) is not None:
            return False
        repo.remember_failed_flags(run_id, number, key=key, outcome=outcome, reason=reason, args=args,
                                   server_version=server_version)
    except Exception as exc:  # noqa: BLE001 - the memory is an optimisation: never fail a search over it
        _logger.warning("cannot remember failed flag set %s: %s", key, str(exc).splitlines()[0])
        return False
    _logger.info("remembered failed flag set %s (%s) from trial %d", key, outcome, number)
    return True
