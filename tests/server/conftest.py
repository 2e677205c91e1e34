"""Fixtures for the serving tests: a stand-in server space for the `command` target, and leak checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from search_spaces import Hardware, load_space_text, resolve
from tuner.targets.server.launch import group_members, port_is_free

STANDIN = Path(__file__).with_name("standin_server.py")

SPACE_YAML = """
name: standin
target: command
objective:
  metric: tok_s
  combine: geomean
  levels: [1, 4]
  constraints:
    - {metric: ttft_ms_p99, level: 4, max: 500}
params:
  context_length:
    type: categorical
    values: [8192, 131072]
    default: 8192
    flag: --context-length
  kv_cache_dtype:
    type: categorical
    values: [auto, fp8_e4m3]
    default: auto
    flag: --kv-cache-dtype
  buckets:
    type: buckets
    max_bs: [4, 8]
    densities: [pow2]
    default: "pow2:8"
    flag: --cuda-graph-bs-decode
  fast_path:
    type: bool
    default: false
    flag: --enable-fast-path
"""


def standin_command() -> list[str]:
    return [sys.executable, str(STANDIN), "--host", "{host}", "--port", "{port}", "--model-path", "{model}"]


@pytest.fixture
def standin_space():
    return resolve(load_space_text(SPACE_YAML, source="standin.yaml"), Hardware())


@pytest.fixture
def make_target(standin_space, tmp_path):
    from tuner.targets.server.target import CommandTarget

    def make(extra_args=(), yaml=None, **settings):
        space = standin_space if yaml is None else resolve(load_space_text(yaml, source="t.yaml"), Hardware())
        base = {
            "command": standin_command(),
            "model": "standin",
            "extra_args": list(extra_args),
            "port_range": "31000-31999",
            "prompt_len": 8,
            "output_len": 20,
            "min_requests": 4,
            "rounds": 1,
            "warmup_requests": 1,
            "fatal_grace_s": 0.5,
            "teardown_reserve_s": 5.0,
            "level_s": 0,
        }
        base.update(settings)
        return CommandTarget(space, base)

    return make


def assert_gone(pgid: int, port: int) -> None:
    """Nothing of the server's process group is alive and its port is free."""
    assert group_members(pgid) == [], f"processes of group {pgid} still alive: {group_members(pgid)}"
    assert port_is_free(port), f"port {port} still busy"
