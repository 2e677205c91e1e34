"""One list of built-in target names: the space loader accepts exactly the names the target registry resolves."""

import pytest

from search_spaces import TARGET_NAMES, SpaceError, load_space_text
from tuner.targets import _CLASSES, target_names

SPACE = """
name: t
target: {target}
objective: {{metric: tok_s, combine: geomean, levels: [1]}}
params:
  x: {{type: categorical, values: [1, 2], default: 1}}
"""


def test_the_loader_and_the_registry_read_one_list_of_target_names():
    assert target_names() == TARGET_NAMES and set(_CLASSES) == set(TARGET_NAMES)
    for name in TARGET_NAMES:
        assert load_space_text(SPACE.format(target=name)).target == name
    with pytest.raises(SpaceError, match="unknown `target`.*'workload', 'sglang', 'kernels', 'command'"):
        load_space_text(SPACE.format(target="vllm"))
