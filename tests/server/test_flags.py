"""Flag validation against the real SGLang parser (skipped with a reason when sglang cannot be imported)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from search_spaces import Hardware, builtin_space_path, load_space, load_space_text, resolve
from tuner.targets.server import flags as fl

HAS_SGLANG = importlib.util.find_spec("sglang") is not None
needs_sglang = pytest.mark.skipif(not HAS_SGLANG, reason="sglang is not installed (pip install --no-deps sglang)")


@pytest.fixture(scope="module")
def sglang_flags():
    if not HAS_SGLANG:
        pytest.skip("sglang is not installed (pip install --no-deps sglang)")
    # installed but its parser broken is a failure (the README's test command installs what --help needs), not a skip
    return fl.introspect_parser(
        sys.executable,
        fl.SGLANG_PARSER,
        [("--kv-cache-dtype", ["fp8_e4m3", "fp9"]), ("--context-length", ["131072", "x"])],
    )


def test_parser_introspection_knows_the_knobs(sglang_flags):
    for name in (
        "--context-length",
        "--kv-cache-dtype",
        "--dsa-decode-backend",
        "--max-running-requests",
        "--chunked-prefill-size",
        "--mem-fraction-static",
        "--tp-size",
        "--tensor-parallel-size",
        "--triton-attention-num-kv-splits",
        "--triton-attention-split-tile-size",
    ):
        assert name in sglang_flags, name
    assert "fp8_e4m3" in sglang_flags.get("--kv-cache-dtype").choices
    assert sglang_flags.get("--tp-size") is sglang_flags.get("--tensor-parallel-size")


def test_parser_own_types_and_choices_refuse_bad_values(sglang_flags):
    errs = sglang_flags.value_errors
    assert any("'fp9'" in e for e in errs["--kv-cache-dtype"])
    assert not any("fp8_e4m3" in e.split(" is ")[0] for e in errs["--kv-cache-dtype"])
    assert any("'x'" in e for e in errs["--context-length"])


def test_renamed_flags_get_the_new_name(sglang_flags):
    if "--cuda-graph-max-bs" in sglang_flags:
        pytest.skip(f"this sglang ({sglang_flags.version}) still has --cuda-graph-max-bs")
    assert sglang_flags.suggest("--cuda-graph-max-bs") == "--cuda-graph-max-bs-decode"
    assert sglang_flags.suggest("--cuda-graph-bs") == "--cuda-graph-bs-decode"
    assert sglang_flags.suggest("--nsa-decode-backend") == "--dsa-decode-backend"
    assert sglang_flags.suggest("--kv-cache-dtyp") == "--kv-cache-dtype"  # plain difflib


def test_deprecations_are_read_from_the_parser(sglang_flags):
    spec = sglang_flags.get("--enable-dp-attention")
    if spec is None:
        pytest.skip("this sglang has no --enable-dp-attention")
    assert spec.deprecated


def _target(yaml_text, **settings):
    from tuner.targets.server.sglang_server import SGLangTarget

    space = resolve(load_space_text(yaml_text, source="t.yaml"), Hardware())
    return SGLangTarget(space, {"model": "/models/dsv4", **settings})


OLD_NAMES = """
name: old
target: sglang
params:
  graph_max_bs: {type: categorical, values: [64, 128], default: 64, flag: --cuda-graph-max-bs}
  decode_backend:
    {type: categorical, values: [flashmla_sparse, tilelang], default: tilelang, flag: --nsa-decode-backend}
  kv: {type: categorical, values: [auto, fp8_e4m3, fp9_e9], default: auto, flag: --kv-cache-dtype}
  dp_attn: {type: bool, default: false, flag: --enable-dp-attention}
"""


@needs_sglang
def test_preflight_refuses_unknown_flags_with_closest_name_and_bad_choices():
    report = _target(OLD_NAMES).preflight()
    text = "\n".join(report.lines())
    assert not report.ok
    assert "--cuda-graph-max-bs is not accepted" in text and "did you mean --cuda-graph-max-bs-decode?" in text
    assert "did you mean --dsa-decode-backend?" in text
    assert "'fp9_e9' is not one of the choices of --kv-cache-dtype" in text
    assert "deprecated: param `dp_attn` uses --enable-dp-attention" in text
    assert "rule `dp-attention-deprecated`" in text
    assert "server version: 0.5" in text


@needs_sglang
def test_builtin_space_passes_preflight_against_installed_sglang():
    space = load_space(builtin_space_path("sglang_dsv4_flash"))
    from tuner.targets.server.sglang_server import SGLangTarget

    target = SGLangTarget(
        resolve(space, Hardware(gpu_name="H200", gpu_count=8, compute_capability=(9, 0))), {"model": "/models/dsv4"}
    )
    report = target.preflight()
    assert report.ok, "\n".join(report.lines())
    assert any("accepted by server" in line for line in report.will_run)


def test_help_text_parser_reads_argparse_output():
    text = """usage: x [-h]
options:
  -h, --help            show this help message and exit
  --port PORT
  --kv-cache-dtype {auto,fp8_e4m3,bf16}
                        kv dtype
  --tp-size TP_SIZE, --tensor-parallel-size TP_SIZE
                        The tensor parallelism size.
  --cuda-graph-bs-decode CUDA_GRAPH_BS_DECODE [CUDA_GRAPH_BS_DECODE ...]
  --enable-fast-path
  --old-thing           Deprecated. Use --new-thing.
"""
    flags = fl.parse_help_text(text)
    assert flags.get("--kv-cache-dtype").choices == ("auto", "fp8_e4m3", "bf16")
    assert flags.get("--tensor-parallel-size") is flags.get("--tp-size")
    assert flags.get("--cuda-graph-bs-decode").is_list
    assert not flags.get("--enable-fast-path").takes_value
    assert flags.get("--old-thing").deprecated
    assert "--help" not in flags
    assert flags.check_value("--kv-cache-dtype", "fp9") is not None


def test_rules_fire_by_name(caplog):
    hits = fl.apply_rules(
        [
            "--enable-torch-compile",
            "--torch-compile-max-bs",
            "64",
            "--cuda-graph-bs-decode",
            "1",
            "2",
            "4",
            "8",
            "16",
            "32",
        ],
        {},
    )
    assert [h.rule for h in hits] == ["torch-compile-bs-above-cuda-graph-bs"]
    assert hits[0].refuse
    assert "torch-compile-bs-above-cuda-graph-bs" in caplog.text
    hits = fl.apply_rules(["--enable-torch-compile"], {"torch_compile_supported": False})
    assert hits[0].rule == "torch-compile-unsupported"
    hits = fl.apply_rules(["--tp-size", "8"], {"gpu_count": 4})
    assert hits[0].rule == "tp-size-above-gpus"
    hits = fl.apply_rules(["--max-running-requests", "16", "--cuda-graph-bs-decode", "1", "64"], {})
    assert hits[0].rule == "cuda-graph-bs-above-max-running" and not hits[0].refuse


def test_params_to_args_bool_buckets_env_and_server_default():
    space = load_space_text("""
name: a
target: sglang
params:
  b: {type: buckets, max_bs: [8], densities: [pow2], default: "pow2:8", flag: --cuda-graph-bs-decode}
  en: {type: bool, default: false, flag: --enable-x}
  dis: {type: bool, default: false, flag: --enable-y}
  backend: {type: categorical, values: [server_default, triton], default: server_default, flag: --dsa-decode-backend}
  frac: {type: float, low: 0.5, high: 0.9, default: 0.8, flag: --mem-fraction-static}
  knob: {type: categorical, values: [a, b], default: a, env: MY_KNOB}
""")
    args, env = fl.params_to_args(
        space.params, {"b": "pow2:8", "en": True, "dis": False, "backend": "server_default", "frac": 0.8, "knob": "b"}
    )
    assert args == ["--cuda-graph-bs-decode", "1", "2", "4", "8", "--enable-x", "--mem-fraction-static", "0.8"]
    assert env == {"MY_KNOB": "b"}


def test_an_export_for_sglang_0_5_12_uses_its_flag_names_and_moves_what_it_cannot_set():
    """The workload export built for 0.5.12's parser (its option names as vendored from its server_args.py by
    scripts/sglang_flag_names.py): a renamed flag under 0.5.12's name, a flag 0.5.12 lacks moved out with one line."""
    from search_spaces import load_space
    from tuner.targets.server.flags import FlagSpec, ServerFlags
    from tuner.targets.workload.deploy import for_installed_release
    from tuner.targets.workload.server_map import command_config, server_launch

    text = (Path(__file__).parent / "data" / "sglang_0.5.12_flags.txt").read_text().splitlines()
    names = [n for n in text if n.startswith("--")]
    flags = ServerFlags([FlagSpec(names=(n,)) for n in names], source="sglang 0.5.12 server_args.py", version="0.5.12")
    space = load_space("dsv4_flash")
    best = {
        "context_length": 131072,
        "indexer_impl": "triton",
        "attention_impl": "mma",
        "kv_cache_dtype": "fp8_e4m3",
        "sparse_num_splits": 4,
        "sparse_block_t": 64,
        "sparse_block_h": 16,
        "gemm_proj": "fp8",
        "gemm_indexer": "fp8",
        "gemm_moe": "fp8",
        "moe_impl": "triton",
        "gemm_mhc": "fp32",
        "gemm_impl": "torch",
        "cuda_graph_buckets": "pow2:64",
        "glue": "eager",
    }
    launch = server_launch(space, command_config(space, best, "gfx950").params)  # gfx950: the fused indexer is kept
    assert "--cuda-graph-bs-decode" in launch.args and "--enable-dsa-fused-indexer" in launch.args
    check = for_installed_release(launch, flags)
    assert check.line == "flags checked by the installed SGLang 0.5.12's own parser"
    assert [a for a in launch.args if a.startswith("--") and a not in names] == []
    assert launch.args[launch.args.index("--cuda-graph-bs") + 1] == "1"
    assert check.moved == [
        "  indexer_impl=triton: SGLang 0.5.12 has no flag --enable-dsa-fused-indexer; moved under "
        "the code changes (this command leaves the server's default)"
    ]
