"""A space extends another (``extends:``) and states only what differs: the CPU twin's space is the GPU space with
its own values, and resolves to exactly the space it was when it repeated the GPU space's lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from search_spaces import SpaceError, load_space, load_space_text
from search_spaces.loader import space_text

ROOT = Path(__file__).resolve().parents[2]
BEFORE = Path(__file__).parent / "data" / "dsv4_flash_tiny_before_extends.yaml"


def test_the_tiny_space_extends_the_gpu_space_and_resolves_to_the_space_it_was_when_it_repeated_it():
    """The tiny file as it was before ``extends`` (186 lines, 160 of them the GPU space's) and the file that extends
    ``dsv4_flash`` load to equal spaces: every param, value, default, server mark, constraint and setting."""
    tiny = load_space("dsv4_flash_tiny")
    assert load_space_text(BEFORE.read_text(), source=tiny.source) == tiny
    text = (ROOT / "search_spaces" / "dsv4_flash_tiny.yaml").read_text()
    assert "extends: dsv4_flash" in text and len(text.splitlines()) < len(BEFORE.read_text().splitlines()) // 2


def test_the_stored_copy_of_an_extending_space_stands_alone():
    """What a study stores (``space_text``) loads without the parent: the resolved space, not ``extends:``."""
    tiny = load_space("dsv4_flash_tiny")
    stored = space_text("dsv4_flash_tiny")
    assert "extends:" not in stored.split("\n", 1)[1]
    assert load_space_text(stored, source=tiny.source) == tiny
    gpu = ROOT / "search_spaces" / "dsv4_flash.yaml"
    assert space_text(gpu) == gpu.read_text()  # a space that extends none is stored as written


PARENT = """
name: base
settings: {warmup: 2, repeats: 6}
params:
  a: {type: categorical, values: [x, y, z], default: x, value_requires: {z: [cuda]}, description: the a knob}
  b: {type: pow2, low: 1, high: 16, default: 4}
  c: {type: categorical, values: [p, q], default: p}
constraints:
  - {name: b-small-on-y, if: {a: [y]}, then: {b: [1, 2]}}
  - {name: c-on-z, if: {c: [q]}, then: {a: [z]}}
"""


def test_a_child_merges_params_in_the_parents_order_removes_with_null_and_drops_keys_with_unset(tmp_path):
    (tmp_path / "base.yaml").write_text(PARENT)
    child = tmp_path / "child.yaml"
    child.write_text("""
extends: base
name: child
settings: {repeats: 3}
params:
  a: {values: [x, y], unset: [value_requires.z, description]}
  n: {type: categorical, values: [1, 2], default: 1}
  c: null
constraints:
  - {name: b-small-on-y, if: {a: [y]}, then: {b: [1]}}
""")
    s = load_space(str(child))
    assert s.name == "child" and s.settings == {"warmup": 2, "repeats": 3}
    assert s.names == ("a", "n", "b")  # n right after the child's entry before it; c removed
    assert s.param("a").values == ("x", "y") and s.param("a").value_requires == {} and s.param("a").description == ""
    assert s.param("b").high == 16
    assert [(c.name, c.then) for c in s.constraints] == [("b-small-on-y", (("b", (1,)),))]  # c-on-z went with c


@pytest.mark.parametrize(
    "child, needle",
    [
        ("extends: nowhere\nname: c\nparams: {a: {values: [x]}}\n", "`extends` names no space"),
        ("extends: base\nname: c\nparams: {zz: null}\n", "removes a param the extended space does not have"),
        (
            "extends: base\nname: c\nparams: {a: {unset: [server.flag]}}\n",
            "`unset` names a key the parent's param does not have",
        ),
        ("extends: child\nname: c\nparams: {a: {values: [x]}}\n", "`extends` goes round in a circle"),
    ],
    ids=["missing", "remove-unknown", "unset-unknown", "circle"],
)
def test_a_bad_extends_is_one_error_line_naming_the_problem(tmp_path, child, needle):
    (tmp_path / "base.yaml").write_text(PARENT)
    (tmp_path / "child.yaml").write_text(child)
    with pytest.raises(SpaceError, match=needle) as err:
        load_space(str(tmp_path / "child.yaml"))
    assert "\n" not in str(err.value)
