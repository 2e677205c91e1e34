"""Every twin knob names its SGLang counterpart, checked against SGLang 0.5.23's own parser and variables."""

from __future__ import annotations

import pytest

from search_spaces import SpaceError, load_space, load_space_text
from tuner.targets.server.flags import introspect_parser
from tuner.targets.workload.server_map import check_counterparts, counterpart_checks, server_launch

pytest.importorskip("sglang")

SPACES = ("dsv4_flash", "dsv4_flash_tiny")


@pytest.mark.parametrize("name", SPACES)
def test_every_workload_knob_names_a_server_counterpart_sglang_accepts(name):
    space = load_space(name)
    flags = introspect_parser(checks=counterpart_checks(space))
    assert flags.version and flags.version.startswith("0.5.23"), flags.version
    assert check_counterparts(space, flags) == []


def test_the_brief_knobs_map_to_their_sglang_flags():
    space = load_space("dsv4_flash")
    flag = {p.name: p.server.flag for p in space.params}
    assert flag["context_length"] == "--context-length"
    assert flag["cuda_graph_buckets"] == "--cuda-graph-bs-decode"
    assert flag["indexer_impl"] == "--enable-dsa-fused-indexer"
    assert flag["attention_impl"] == "--dsv4-attn-backend"  # V4's decode; --dsa-decode-backend is V3.2's
    assert flag["sparse_num_splits"] == "--triton-attention-num-kv-splits"
    assert flag["moe_impl"] == "--moe-runner-backend"
    assert flag["glue"] == "--enable-torch-compile"
    assert flag["gemm_impl"] == "--fp8-gemm-backend"  # its sglang_triton value; DeepGEMM with the flag left out
    for knob in ("gemm_proj", "gemm_indexer", "gemm_moe", "gemm_mhc", "sparse_block_t"):
        assert space.param(knob).server.none, knob  # marked as having no counterpart, with a reason


def test_a_wrong_flag_or_value_is_caught_by_the_parser():
    space = load_space_text("""
name: bad
params:
  context_length: {type: categorical, values: [4096, lots], default: 4096, server: {flag: --context-length}}
  graphs: {type: categorical, values: [a], default: a, server: {flag: --cuda-graph-max-bs}}
  dtype: {type: categorical, values: [a], default: a, server: {env: SGLANG_NO_SUCH_VARIABLE}}
  bare: {type: categorical, values: [a], default: a}
""")
    problems = check_counterparts(space, introspect_parser(checks=counterpart_checks(space)))
    text = "\n".join(problems)
    assert "'lots' is not accepted by --context-length" in text
    assert "--cuda-graph-max-bs is not a flag" in text
    assert "SGLang reads no variable SGLANG_NO_SUCH_VARIABLE" in text
    assert "`bare` has no `server:` annotation" in text


def test_server_launch_translates_values_and_lists_knobs_without_a_flag():
    space = load_space("dsv4_flash")
    params = {
        **space.defaults(),
        "context_length": 131072,
        "attention_impl": "mma",
        "sparse_num_splits": 4,
        "sparse_block_t": 64,
        "sparse_block_h": 16,
        "glue": "compile",
        "moe_impl": "triton",
        "cuda_graph_buckets": "pow2:32",
        "gemm_proj": "fp8",
    }
    launch = server_launch(space, params)
    a = launch.args
    assert a[a.index("--context-length") + 1] == "131072"
    # every twin attention leaves DeepSeek-V4's default (FlashMLA on Hopper); --dsa-decode-backend does not govern it
    assert "--dsv4-attn-backend" not in a and "--dsa-decode-backend" not in a
    assert a[a.index("--triton-attention-num-kv-splits") + 1] == "4"
    # the twin's fused MoE stands in for SGLang's own MoE path: the flag stays at auto (flashinfer_mxfp4 for V4-Flash's
    # FP4 experts on sm_90); `triton` would route them to the FP8 method
    assert "--moe-runner-backend" not in a
    assert a[a.index("--cuda-graph-bs-decode") + 1 : a.index("--cuda-graph-bs-decode") + 7] == [
        "1",
        "2",
        "4",
        "8",
        "16",
        "32",
    ]
    assert a[a.index("--torch-compile-max-bs") + 1] == "32"  # no larger than the largest captured graph
    assert "--enable-dsa-fused-indexer" not in a  # torch indexer: the server's default path
    assert {p.name for p, _ in launch.unmapped} == {
        "gemm_proj",
        "gemm_indexer",
        "gemm_moe",
        "gemm_mhc",
        "sparse_block_t",
        "sparse_block_h",
    }
    assert "--fp8-gemm-backend" not in a  # gemm_impl=torch leaves the flag at auto
    assert a[a.index("--kv-cache-dtype") + 1] == "bf16"
    fp8 = server_launch(space, {**params, "kv_cache_dtype": "fp8_e4m3"}).args
    assert fp8[fp8.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    none = server_launch(space, {**space.defaults(), "cuda_graph_buckets": "none:1"})
    assert "--disable-decode-cuda-graph" in none.args


@pytest.mark.parametrize(
    "server, why",
    [
        ("{flag: context-length}", "long option name"),
        ("{flag: --a, env: B}", "exactly one of"),
        ("{none: ''}", "must say why"),
        ("{flag: --a, values: {x: 1}}", "cannot take"),
        ("{flag: --a, colour: red}", "unknown key `colour`"),
        ("--context-length", "must be a mapping"),
        ("{flag: --a, not_deployable: {x: {kind: broken, why: w, source: s, instead: x}}}", "`kind` must be one of"),
        ("{flag: --a, not_deployable: {x: {kind: fails, why: w, source: s}}}", "`instead`"),
        ("{flag: --a, not_deployable: {x: {kind: fails, why: w, source: s, instead: nope}}}", "cannot take"),
        ("{flag: --a, not_deployable: {x: {kind: fails, why: '', source: s, instead: x}}}", "`why` must be"),
        ("{flag: --a, deploys_as: x}", "goes with `none`, or with a flag whose `values` leave it out"),
    ],
)
def test_a_bad_server_annotation_is_one_line_naming_it(server, why):
    with pytest.raises(SpaceError) as err:
        load_space_text(
            f"name: s\nparams:\n  k: {{type: categorical, values: [a], default: a, server: {server}}}\n",
            source="s.yaml",
        )
    msg = str(err.value)
    assert "\n" not in msg and "param `k` server" in msg and why in msg, msg


def test_the_workload_preflight_names_each_knobs_sglang_counterpart():
    from search_spaces import Hardware, resolve
    from tuner.targets.workload.target import WorkloadTarget

    report = WorkloadTarget(resolve(load_space("dsv4_flash_tiny"), Hardware()), {}).preflight()
    fact = report.facts["sglang counterparts"]
    assert "context_length -> --context-length" in fact and "no SGLang flag: indexer_width, gemm_proj" in fact
