"""The memory of server launches that failed, kept in the study's storage (table ``tuner_failed_flags``), so a
study does not spend a launch on a flag set that fails by construction.

A launch is keyed by everything that makes it what it is: the server's version, its command (the port left out),
the environment, the flag arguments and the GPUs. Only failures before the server became ready are kept (a rerun
of the same launch meets the same start); and only those that repeat by construction refuse a launch: the server
rejected its arguments (``invalid_config``), or the launch failed at start the same way (same outcome) twice. A
failure after start (a crash under load, a kill from outside), a timeout, a pruned trial and a ``request_error``
(the load's fault, not the flags') never refuse one. The memory is the study's (setting ``failed_scope: study``)
unless the user asks for the whole storage (``failed_scope: storage``). The search never asks the memory about the
baseline: every figure needs it measured.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

_logger = logging.getLogger(__name__)

REMEMBERED = ("invalid_config", "oom", "crash", "compile_error", "out_of_resources")
"""Outcomes of a failed start that are kept; timeouts, pruned trials and request errors are not."""
BY_CONSTRUCTION = ("invalid_config",)
"""Outcomes that refuse the launch at once: the server rejected its arguments."""
SAME_WAY_TWICE = 2
"""Starts that failed with one outcome that refuse the launch (any other kept outcome)."""


def flag_set_key(
    command: Sequence[str], args: Sequence[str], env: dict[str, str], *, server_version: str = "", gpus: str = ""
) -> str:
    """The key of one launch: a hash of the server's version, command, flags, environment and GPUs."""
    payload = json.dumps(
        {
            "command": list(command),
            "args": list(args),
            "env": sorted(env.items()),
            "server_version": server_version,
            "gpus": gpus,
        }
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def known_failure(repo: Any, key: str, run_id: int | None = None) -> str | None:
    """Why the launch ``key`` is refused without running, or ``None``: its arguments were rejected, or it failed
    at start the same way :data:`SAME_WAY_TWICE` times, in study run ``run_id`` (every study when ``None``)."""
    try:
        history = repo.failed_flag_history(key, run_id)
    except Exception as exc:  # noqa: BLE001 - an older database without the table: nothing remembered there
        _logger.info("failed-flag memory unavailable: %s", str(exc).splitlines()[0])
        return None
    by_outcome: dict[str, list[Any]] = {}
    for rec in history:
        by_outcome.setdefault(rec.outcome, []).append(rec)
    for outcome, recs in by_outcome.items():
        if outcome in BY_CONSTRUCTION or len(recs) >= SAME_WAY_TWICE:
            prior = recs[-1]
            times = "" if outcome in BY_CONSTRUCTION else f" at start {len(recs)} times, last"
            return (
                f"this exact flag set already failed{times} (study run {prior.run_id}, trial "
                f"{prior.trial_number}, {prior.outcome}: {prior.reason[:200]}); set `allow_retry: true` to run "
                "it again"
            )
    return None


def remember(
    repo: Any,
    run_id: int,
    number: int,
    *,
    key: str,
    outcome: str,
    reason: str,
    args: Sequence[str],
    server_version: str = "",
    at_start: bool = True,
) -> bool:
    """Keep a launch that failed before its server was ready (only :data:`REMEMBERED` outcomes); True when kept.
    A failure after start (``at_start`` false) is never kept: the same flags may well run the next time."""
    if outcome not in REMEMBERED or not at_start:
        return False
    try:
        repo.remember_failed_flags(
            run_id, number, key=key, outcome=outcome, reason=reason, args=args, server_version=server_version
        )
    except Exception as exc:  # noqa: BLE001 - the memory is an optimisation: never fail a search over it
        _logger.warning("cannot remember failed flag set %s: %s", key, str(exc).splitlines()[0])
        return False
    _logger.info("remembered failed flag set %s (%s at start) from trial %d", key, outcome, number)
    return True
