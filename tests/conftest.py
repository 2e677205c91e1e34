"""Shared fixtures. Trial subprocesses import test-only targets (``fake_targets``) through PYTHONPATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
_paths = [str(TESTS / "helpers"), str(ROOT)]
os.environ["PYTHONPATH"] = os.pathsep.join(_paths + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
for p in _paths:
    if p not in sys.path:
        sys.path.insert(0, p)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'tuner.db'}"
