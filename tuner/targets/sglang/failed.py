"""A small JSON cache of flag sets that already failed, so the search never spends GPU time on them twice.

The key hashes everything that changes the launch except the port: the flag arguments, the environment the
params set, and the server command. Writers take an ``fcntl`` lock (several trial processes may finish at once).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_logger = logging.getLogger(__name__)

DEFAULT_PATH = "~/.cache/tuner/failed_flags.json"
REMEMBERED = ("invalid_config", "oom", "crash", "compile_error", "out_of_resources")
"""Outcomes that a rerun of the same flags would repeat; timeouts and pruned trials are not remembered."""


def flag_set_key(command: Sequence[str], args: Sequence[str], env: dict[str, str]) -> str:
    payload = json.dumps({"command": list(command), "args": list(args), "env": sorted(env.items())})
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


class FailedFlags:
    def __init__(self, path: str | os.PathLike[str] = DEFAULT_PATH) -> None:
        self.path = Path(path).expanduser()

    def _load(self) -> dict[str, Any]:
        try:
            with open(self.path) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, json.JSONDecodeError):
            return {}

    def get(self, key: str) -> dict[str, Any] | None:
        return self._load().get(key)

    @contextlib.contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(str(self.path) + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def record(self, key: str, outcome: str, reason: str, args: Sequence[str]) -> None:
        if outcome not in REMEMBERED:
            return
        try:
            with self._locked():
                data = self._load()
                data[key] = {"outcome": outcome, "reason": reason[:500], "args": list(args), "at": time.time()}
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(data, indent=1))
                os.replace(tmp, self.path)
        except OSError as exc:  # the cache is an optimisation: never fail a trial over it
            _logger.warning("cannot record failed flags in %s: %s", self.path, exc)
            return
        _logger.info("remembered failed flag set %s (%s) in %s", key, outcome, self.path)
