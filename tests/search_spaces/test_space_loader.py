import pytest

from search_spaces import Hardware, SpaceError, builtin_space_path, expand_buckets, load_space, load_space_text, resolve
from search_spaces.buckets import bucket_for

GOOD = """
name: t
params:
  a: {type: categorical, values: [x, y], default: x}
  n: {type: pow2, low: 1, high: 16, default: 4, when: {a: [y]}}
  f: {type: float, low: 0.1, high: 0.9, default: 0.5}
  b: {type: bool, default: false}
  g: {type: buckets, max_bs: [16, 64], densities: [pow2, step8], default: {density: pow2, max_bs: 64}}
constraints:
  - {name: no-big-n, if: {a: [y]}, then: {n: [1, 2, 4]}}
"""


def test_good_space_loads_with_types_and_defaults():
    s = load_space_text(GOOD, source="good.yaml")
    assert s.names == ("a", "n", "f", "b", "g")
    assert s.defaults() == {"a": "x", "f": 0.5, "b": False, "g": "pow2:64"}  # n inactive: a != y
    assert s.param("n").choices() == (1, 2, 4, 8, 16)
    assert set(s.param("g").values) == {"pow2:16", "pow2:64", "step8:16", "step8:64"}
    assert [c.name for c in s.violated_constraints({"a": "y", "n": 8})] == ["no-big-n"]
    assert s.violated_constraints({"a": "y", "n": 4}) == []


@pytest.mark.parametrize(
    "text,needle",
    [
        ("name: t\nparams:\n  a: {type: weird, default: 1}\n", "unknown type"),
        ("name: t\nparams:\n  a: {type: categorical, values: [1, 2], default: 3}\n", "default is not one of"),
        ("name: t\nparams:\n  a: {type: int, low: 5, high: 1, default: 2}\n", "low <= high"),
        ("name: t\nparams:\n  a: {type: categorical, values: [1], default: 1, colour: red}\n", "unknown key `colour`"),
        ("name: t\nparams:\n  a: {type: categorical, values: [1], default: 1}\nfoo: 1\n", "unknown top-level key"),
        ("name: t\nparams:\n  a: {type: categorical, values: [1], default: 1, when: {zz: [1]}}\n", "unknown parameter"),
        ("name: t\nparams: [1, 2\n", "broken YAML"),
        ("name: t\nparams:\n  a: {type: pow2, low: 3, high: 16, default: 4}\n", "powers of two"),
        (
            "name: t\nparams:\n  a: {type: categorical, values: [1], default: 1, requires: [warp-drive]}\n",
            "unknown capability",
        ),
        ("name: t\nparams:\n  a: {type: buckets, max_bs: [0], default: {density: pow2, max_bs: 0}}\n", "max_bs"),
        (
            "name: t\nparams:\n  a: {type: categorical, values: [1, 2], default: 1}\nconstraints:\n"
            "  - {name: c, if: {a: [1]}, then: {a: [2]}}\n",
            "defaults violate constraint `c`",
        ),
        ("name: t\nobjective: {combine: best}\nparams:\n  a: {type: bool, default: true}\n", "unknown `combine`"),
        (
            "name: t\nparams:\n  a: {type: categorical, values: [1], default: 1, flag: context-length}\n",
            "starting with '-'",
        ),
        ("- just\n- a list\n", "must be a YAML mapping"),
    ],
)
def test_bad_space_errors_are_one_line_and_name_the_thing(text, needle):
    with pytest.raises(SpaceError) as err:
        load_space_text(text, source="bad.yaml")
    msg = str(err.value)
    assert needle in msg
    assert msg.startswith("bad.yaml")
    assert "\n" not in msg


def test_missing_file_names_builtins(tmp_path):
    with pytest.raises(SpaceError, match="dsv4_flash"):
        load_space(tmp_path / "nope.yaml")


@pytest.mark.parametrize("name", ["dsv4_flash", "dsv4_flash_tiny"])
def test_builtin_spaces_cover_the_five_families(name):
    s = load_space(name)
    assert builtin_space_path(name).exists()
    kinds = {p.name for p in s.params}
    assert "context_length" in kinds  # context caps
    assert any(p.type == "buckets" for p in s.params)  # CUDA-graph buckets
    assert any(p.name.startswith("gemm_") for p in s.params)  # GEMM dtypes
    assert any(p.kernel and p.kernel.endswith(".S") for p in s.params)  # split-K
    if name == "dsv4_flash":
        assert any(p.kernel and "BLOCK" in p.kernel for p in s.params)  # tile sizes


def test_resolve_cpu_drops_gpu_only_values_with_reasons():
    s = load_space("dsv4_flash")
    r = resolve(s, Hardware())
    reasons = {(i.param, i.value): i.reason for i in r.inactive}
    assert ("cuda_graph_buckets", None) in reasons
    assert ("gemm_proj", "fp8") in reasons and "fp8" in reasons[("gemm_proj", "fp8")]
    assert ("attention_impl", "mma") in reasons
    assert ("sparse_num_splits", None) in reasons  # its condition cannot hold without mma
    d = r.defaults()
    assert d["attention_impl"] == "torch"  # simt needs triton on a GPU
    assert "cuda_graph_buckets" not in d
    assert any("attention_impl" in n for n in r.notes)


def test_resolve_h200_keeps_everything_but_fp4_and_its_baseline_is_sglangs_path():
    s = load_space("dsv4_flash")
    hw = Hardware(
        gpu_name="NVIDIA H200",
        gpu_count=1,
        compute_capability=(9, 0),
        has_triton=True,
        has_torch_compile=True,
        has_gluon=True,
        has_flash_mla=True,
        has_deep_gemm=True,
        has_sglang_jit=True,
        has_sglang_triton=True,
    )
    r = resolve(s, hw)
    assert r.inactive == ()
    assert r.defaults() == {**s.defaults(), **s.deployment.baseline("sm_90")} != s.defaults()
    names = {p.name for p in r.params}
    assert {"cuda_graph_buckets", "sparse_num_splits", "attention_impl"} <= names


def test_attention_impl_wgmma_needs_a_hopper_gpu_and_gluon():
    """The Gluon kernel is sm_90 only (wgmma): not on an H200 whose Triton lacks Gluon, not on Ampere or Blackwell;
    each drops just that value, with the capability named."""
    s = load_space("dsv4_flash")
    for hw in (
        Hardware(gpu_name="NVIDIA H200", gpu_count=1, compute_capability=(9, 0), has_triton=True),
        Hardware(gpu_name="A100", gpu_count=1, compute_capability=(8, 0), has_triton=True, has_gluon=True),
        Hardware(gpu_name="B200", gpu_count=1, compute_capability=(10, 0), has_triton=True, has_gluon=True),
    ):
        r = resolve(s, hw)
        values = next(p for p in r.params if p.name == "attention_impl").values
        assert "wgmma" not in values and "mma" in values, hw.gpu_name
        assert [
            (i.param, i.value) for i in r.inactive if i.param == "attention_impl" and not i.value.startswith("flashmla")
        ] == [("attention_impl", "wgmma")]
        assert "wgmma" in str(r.inactive) and "Gluon" in str(r.inactive), hw.gpu_name
    hopper = Hardware(gpu_name="NVIDIA H200", gpu_count=1, compute_capability=(9, 0), has_triton=True, has_gluon=True)
    assert "wgmma" in hopper.capabilities and Hardware.from_json(hopper.to_json()) == hopper


def test_resolve_ampere_has_no_fp8():
    s = load_space("dsv4_flash")
    hw = Hardware(gpu_name="A100", gpu_count=1, compute_capability=(8, 0), has_triton=True)
    r = resolve(s, hw)
    assert (
        "fp8" not in r.space.param("gemm_proj").values
        or "fp8" not in next(p for p in r.params if p.name == "gemm_proj").values
    )


def test_buckets_expand():
    assert expand_buckets("pow2:64") == [1, 2, 4, 8, 16, 32, 64]
    assert expand_buckets("step8:24") == [1, 2, 4, 8, 16, 24]
    assert expand_buckets("server_default:20") == [1, 2, 4, 8, 12, 16, 20]
    assert expand_buckets("none:1") == []
    assert bucket_for(5, [1, 2, 4, 8]) == 8
    assert bucket_for(9, [1, 2, 4, 8]) is None
    with pytest.raises(ValueError):
        expand_buckets("dense:8")
