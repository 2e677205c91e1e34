"""Small spaces for tests."""

from pathlib import Path

FAKE_SPACE = """
name: fake
target: fake_targets:FakeTarget
settings: {sleep_s: 0.0}
objective: {metric: tok_s, combine: geomean, levels: [1, 4]}
params:
  mode:
    type: categorical
    values: [ok, crash, hang, oom, raise]
    default: ok
  x:
    type: categorical
    values: [0, 1, 2, 3, 4, 5, 6, 7]
    default: 0
"""


TINY_SPACE_PATH = Path(__file__).resolve().parents[2] / "search_spaces" / "dsv4_flash_tiny.yaml"
"""The CPU twin's built-in space (what `tuner search` runs on a machine without a GPU)."""


def tiny_workload_run(url: str, name: str, budget_s: float):
    """A fresh workload study of the CPU twin's space in the database at ``url``: ``(repo, run, space)``, for tests
    that store trials by hand and then ask the search's decision or the export."""
    from search_spaces import load_space
    from search_spaces.loader import space_text
    from storage import Repo

    space = load_space(str(TINY_SPACE_PATH))
    repo = Repo(url)
    repo.create_schema()
    run = repo.create_run(
        name,
        target="workload",
        budget_s=budget_s,
        objective="geomean",
        space_name=space.name,
        space_yaml=space_text(TINY_SPACE_PATH),
    )
    return repo, run, space
