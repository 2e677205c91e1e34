"""Fixtures for the worker tests (defined in ``workerkit``, which also holds the helpers tests import)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workerkit import pg_url, private_pg  # noqa: E402,F401
