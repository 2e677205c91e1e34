"""Every shipped tuned config names where it came from: the kernel search study that tuned it, or the stored benchmark
result it was taken from (``source``); a stored result it names is in the tree. ``kernels/tuned/`` is written only by
``tuner search --target kernels``; benchmarks write tuned configs to a folder of their own."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "kernels" / "tuned").glob("*.json"))
STORED = re.compile(r"benchmarks/results/[\w./-]+\.(?:md|json(?:\.gz)?)")


def test_there_are_shipped_configs_to_check():
    assert len(SHIPPED) >= 10


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_each_shipped_entry_names_its_study_or_stored_result_and_that_result_exists(path):
    entries = json.loads(path.read_text())
    assert entries
    for key, entry in entries.items():
        source = entry.get("source", "")
        assert source.startswith(("kernel search study ", "benchmarks/results/")), (key, source)
        for cited in STORED.findall(source):
            assert (ROOT / cited).is_file(), (key, cited)
        if source.startswith("kernel search study "):
            assert entry.get("study") and source.startswith(f"kernel search study {entry['study']} "), (key, source)
