"""What the exported SGLang command can give: per-value deployability marks, the command's configuration, the
``deployable_only`` search space, the FlashMLA values' requirement (issue 42)."""

import itertools

import pytest

from search_spaces import Hardware, load_space, resolve
from tuner.targets.workload.deploy import for_installed_release
from tuner.targets.workload.server_map import command_config, server_launch

H200 = Hardware(
    gpu_name="NVIDIA H200",
    gpu_count=1,
    compute_capability=(9, 0),
    has_triton=True,
    has_torch_compile=True,
    has_gluon=True,
    has_flash_mla=True,
    has_deep_gemm=True,
    has_sglang_jit=True,
)
BEST = {
    "context_length": 8192,
    "indexer_impl": "triton",
    "attention_impl": "wgmma",
    "kv_cache_dtype": "bf16",
    "gemm_proj": "bf16",
    "gemm_indexer": "bf16",
    "gemm_moe": "bf16",
    "moe_impl": "triton",
    "gemm_mhc": "fp32",
    "gemm_impl": "triton",
    "cuda_graph_buckets": "pow2:64",
    "glue": "compile",
}


def test_declined_failing_and_code_change_values_are_credited_only_to_the_code_changes():
    space = load_space("dsv4_flash")
    cmd = command_config(space, BEST, "sm_90")
    changed = {c.param: c for c in cmd.changes}
    assert set(changed) == {
        "indexer_impl",
        "attention_impl",
        "kv_cache_dtype",
        "gemm_proj",
        "gemm_indexer",
        "gemm_moe",
        "gemm_impl",
        "glue",
    }
    assert changed["indexer_impl"].why.startswith("declined (except on gfx950)")
    assert changed["glue"].why.startswith("fails") and "decode_cuda_graph_runner.py:603" in changed["glue"].why
    assert cmd.params["attention_impl"] == "flashmla_kv" and cmd.params["kv_cache_dtype"] == "fp8_e4m3"
    assert not space.violated_constraints(cmd.params)
    args = server_launch(space, cmd.params).args
    assert "--enable-dsa-fused-indexer" not in args and "--enable-torch-compile" not in args
    assert args[args.index("--cuda-graph-bs-decode") + 1] == "1" and "--context-length" in args
    # on gfx950 SGLang runs the fused indexer: the command keeps it
    assert command_config(space, BEST, "gfx950").params["indexer_impl"] == "triton"


def test_a_knob_of_a_code_change_is_listed_under_it():
    space = load_space("dsv4_flash")
    best = {**BEST, "attention_impl": "mma", "sparse_num_splits": 4, "sparse_block_t": 32, "sparse_block_h": 16}
    lines = command_config(space, best, "sm_90").lines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("  attention_impl=mma"))
    assert [ln.split(":")[0].strip() for ln in lines[i + 1 : i + 4]] == [
        "sparse_num_splits=4",
        "sparse_block_t=32",
        "sparse_block_h=16",
    ]


@pytest.mark.parametrize("name", ["dsv4_flash", "dsv4_flash_tiny"])
def test_deployable_only_never_offers_a_value_the_command_cannot_set(name):
    space = load_space(name)
    full, only = resolve(space, H200), resolve(space, H200, deployable_only=True)
    assert len(only.params) < len(full.params) or any(
        len(a.values) < len(b.values) for a, b in zip(only.params, full.params)
    )
    for p in only.params:
        for v in p.choices():
            assert p.server is None or p.server.blocker(v, H200.arch) is None, (p.name, v)
    for name_, v in only.fixed.items():
        p = space.param(name_)
        assert p.server is None or p.server.blocker(v, H200.arch) is None, (name_, v)
    # every configuration it can build is its own command
    choices = [p.choices() for p in only.params]
    for combo in itertools.islice(itertools.product(*choices), 200):
        params = only.walk(lambda p, it=iter(combo), by={q.name: c for q, c in zip(only.params, combo)}: by[p.name])
        assert not command_config(space, params, H200.arch).changes


def test_the_flashmla_values_are_inactive_with_the_reason_without_sgl_flash_mla():
    h100_no_wheel = Hardware(
        gpu_name="NVIDIA H100",
        gpu_count=1,
        compute_capability=(9, 0),
        has_triton=True,
        has_gluon=True,
        has_flash_mla=False,
    )
    r = resolve(load_space("dsv4_flash"), h100_no_wheel)
    reasons = {i.value: i.reason for i in r.inactive if i.param == "attention_impl"}
    assert set(reasons) == {"flashmla_kv", "flashmla_sparse"}
    assert all("sgl-flash-mla" in why for why in reasons.values())
    assert (
        "flashmla_kv"
        in next(p for p in resolve(load_space("dsv4_flash"), H200).params if p.name == "attention_impl").values
    )


def test_the_installed_sglang_checks_the_commands_flags():
    pytest.importorskip("sglang")
    space = load_space("dsv4_flash")
    launch = server_launch(space, command_config(space, BEST, "sm_90").params)
    check = for_installed_release(launch)
    assert "installed SGLang 0.5.23" in check.line and check.moved == []


# A CPU-runnable space in which the exported command always differs from the twin's best: each value of gemm_mhc is
# marked as a code change whose `instead` is the other one, so the command's configuration runs (on a CPU) and is
# measured beside the best.
SWAP_SPACE = """
name: swap
target: workload
preset: dsv4-flash-tiny
settings: {live_context: 128, warmup: 1, repeats: 1}
objective: {metric: tok_s, combine: geomean, levels: [1, 16], unit: tok/s}
params:
  context_length:
    type: categorical
    server: {flag: --context-length}
    values: [4096, 131072]
    default: 131072
  gemm_mhc:
    type: categorical
    server:
      none: a test's stand-in for a code change
      not_deployable:
        fp32: {kind: code_change, why: a test mark, source: this test, instead: bf16}
        bf16: {kind: code_change, why: a test mark, source: this test, instead: fp32}
    values: [fp32, bf16]
    default: fp32
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_workload_search_measures_the_command_beside_the_best_and_the_export_gives_both(tmp_path):
    import json
    import subprocess
    import sys

    (tmp_path / "swap.yaml").write_text(SWAP_SPACE)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner",
            "search",
            "--budget",
            "240s",
            "--space",
            "swap.yaml",
            "--seed",
            "1",
            "--confirm-top",
            "1",
            "-o",
            "out",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    dest = next((tmp_path / "out").iterdir())
    text = (dest / "launch.sh").read_text()
    command = next(ln for ln in text.splitlines() if ln.startswith("#   this command: "))
    changes = next(ln for ln in text.splitlines() if ln.startswith("#   with these code changes: "))
    assert "not measured" not in command and "x (" in command and "trials" in command, command
    assert "x (" in changes, changes
    lines = text.splitlines()
    code = lines.index("# with these code changes (the twin's best; this command cannot give them):")
    credited = [i for i, ln in enumerate(lines) if ln.startswith("#   gemm_mhc=") and "(the command runs" in ln]
    assert len(credited) == 1 and credited[0] > code  # the best's value credited under the code changes only
    rec = json.loads(next(ln for ln in text.splitlines() if ln.startswith("# tuner-recorded: "))[18:])
    assert rec["remeasure_command"] == "remeasure_command.sh" and (dest / "remeasure_command.sh").is_file()
    v = subprocess.run(
        [sys.executable, "-m", "tuner", "verify", str(dest / "launch.sh"), "--tolerance", "0.95"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "the exported command's configuration (remeasure_command.sh)" in v.stdout, v.stdout + v.stderr
    assert v.stdout.count("c=16:") == 2, v.stdout
    from tuner.explain import explain

    md = explain(f"sqlite:///{tmp_path / 'tuner.db'}", dest.name, profile=False).markdown()
    assert "## The exported command against the twin's best" in md and "| best / command |" in md, md


def test_without_sglangs_jit_the_command_stage_keeps_the_torch_top_k_as_a_stand_in_and_says_so():
    from dataclasses import replace

    only = resolve(load_space("dsv4_flash"), replace(H200, has_sglang_jit=False), deployable_only=True)
    assert only.fixed["indexer_topk"] == "torch" and "indexer_topk" not in {p.name for p in only.params}
    said = [n for n in only.notes if n.startswith("`indexer_topk`: no value the exported command runs can run here")]
    assert said and "the twin runs 'torch' in its place" in said[0], only.notes
