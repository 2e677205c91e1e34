"""The deployment map (search_spaces/deployments/): what SGLang 0.5.23 runs for each component of DeepSeek-V4's decode
step, per GPU architecture, each claim with its source line; and the baseline a GPU the map covers gets from it.

The source checks read the installed SGLang (the tests' own `--no-deps` install of the pinned release): a release that
moves or drops a dispatch line fails here, not in a user's export."""

import importlib.metadata
import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest

from search_spaces import Hardware, load_space, load_space_text, resolve
from search_spaces.deployment import load_deployment
from search_spaces.schema import SpaceError

H200_ALL = Hardware(
    gpu_name="NVIDIA H200",
    gpu_count=1,
    compute_capability=(9, 0),
    has_triton=True,
    has_gluon=True,
    has_flash_mla=True,
    has_deep_gemm=True,
    has_torch_compile=True,
)
H200_BARE = Hardware(gpu_name="NVIDIA H200", gpu_count=1, compute_capability=(9, 0), has_triton=True)


def _sglang_root() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("SGLang is not installed (scripts/test.sh installs the pinned release --no-deps)")
    return Path(list(spec.submodule_search_locations)[0])


def test_every_source_line_of_the_map_holds_its_text_in_the_installed_sglang():
    root = _sglang_root()
    dep = load_deployment("sglang-0.5.23-dsv4")
    assert dep.release == "sglang==0.5.23"
    if importlib.metadata.version("sglang") != "0.5.23":
        pytest.skip("the installed SGLang is not the release the map was read from")
    for run in dep.runs:
        lines = (root / run.source.file).read_text().splitlines()
        near = lines[max(0, run.source.line - 4) : run.source.line + 3]
        assert any(run.source.text in line for line in near), (
            f"{run.component}: {run.source} no longer holds {run.source.text!r}"
        )


def test_sglang_routes_fp4_experts_on_sm90_to_flashinfer_mxfp4_and_triton_elsewhere():
    """The export leaves --moe-runner-backend at auto for the twin's fused MoE: SGLang's own dispatch sends V4-Flash's
    FP4 experts to FlashInfer's MXFP4 MoE on sm_90, and a `triton` runner would fall through to the FP8 method."""
    root = _sglang_root()
    overrides = (root / "srt/arg_groups/model_overrides/deepseek_v4.py").read_text()
    block = overrides[overrides.index('if cfg.moe_runner_backend == "auto"') :]
    assert "model_config.is_fp4_experts" in block and "get_platform().is_sm90" in block
    assert block.index("is_sm90") < block.index('overrides["moe_runner_backend"] = "flashinfer_mxfp4"')
    fp8 = (root / "srt/layers/quantization/fp8.py").read_text()
    fp4 = fp8[fp8.index("if self.is_fp4_experts and get_moe_runner_backend().is_marlin()") :]
    routed = [
        b for b in ("is_marlin()", "is_humming()", "is_flashinfer_mxfp4()") if b in fp4.split("return fp8_method")[0]
    ]
    assert routed == ["is_marlin()", "is_humming()", "is_flashinfer_mxfp4()"]  # no triton branch for FP4 experts
    space = load_space("dsv4_flash")
    assert space.param("moe_impl").server.server_value("triton") is None  # the flag left at auto


def test_an_h200_baseline_is_sglangs_default_path():
    space = load_space("dsv4_flash")
    base = resolve(space, H200_ALL).defaults()
    assert {
        k: base[k]
        for k in (
            "attention_impl",
            "kv_cache_dtype",
            "indexer_impl",
            "glue",
            "moe_impl",
            "gemm_proj",
            "gemm_moe",
            "gemm_indexer",
            "context_length",
        )
    } == {
        "attention_impl": "flashmla_kv",
        "kv_cache_dtype": "fp8_e4m3",
        "indexer_impl": "deepgemm",
        "glue": "fused",
        "moe_impl": "triton",
        "gemm_proj": "fp8",
        "gemm_moe": "fp8",
        "gemm_indexer": "fp8",
        "context_length": 1048576,
    }
    assert not space.violated_constraints(base)


def test_a_component_that_cannot_run_here_keeps_the_spaces_defaults_together_and_says_why():
    space = load_space("dsv4_flash")
    resolved = resolve(space, H200_BARE)  # no sgl-flash-mla, no deep_gemm
    base = resolved.defaults()
    assert base["attention_impl"] == space.param("attention_impl").default
    assert base["kv_cache_dtype"] == "bf16"  # the cache goes with the attention: SIMT reads no fp8 cache
    assert base["indexer_impl"] == "torch" and base["glue"] == "fused"
    assert not space.violated_constraints(base)
    why = [n for n in resolved.notes if "sparse_attention" in n]
    assert why and "flash_mla" in why[0] and "keeps the space's defaults" in why[0]


def test_a_cpu_and_an_uncovered_gpu_keep_the_spaces_defaults():
    space = load_space("dsv4_flash")
    assert resolve(space, Hardware()).defaults() == resolve(space, Hardware()).walk(lambda p: p.default)
    a100 = Hardware(gpu_name="NVIDIA A100", gpu_count=1, compute_capability=(8, 0), has_triton=True)
    assert resolve(space, a100).defaults()["indexer_impl"] == space.param("indexer_impl").default


def test_the_twin_torch_indexer_on_sm90_is_a_code_change_the_command_runs_as_deepgemm():
    from tuner.targets.workload.server_map import command_config

    space = load_space("dsv4_flash")
    twin = {**resolve(space, H200_ALL).defaults(), "indexer_impl": "torch", "glue": "eager"}
    del twin["indexer_topk"]  # a knob of indexer_impl=deepgemm: a trial of the torch indexer has none
    cfg = command_config(space, twin, "sm_90")
    assert cfg.params["indexer_impl"] == "deepgemm" and cfg.params["glue"] == "sglang"
    assert {c.param for c in cfg.changes} == {"indexer_impl", "glue"}
    on_cpu = command_config(space, {**resolve(space, Hardware()).defaults(), "indexer_impl": "torch"}, None)
    assert on_cpu.params["indexer_impl"] == "torch" and "indexer_impl" not in {c.param for c in on_cpu.changes}


def test_a_map_naming_a_knob_the_space_lacks_is_one_error_line():
    text = (
        "name: x\ntarget: workload\ndeployment: sglang-0.5.23-dsv4\nparams:\n  indexer_impl:\n"
        "    type: categorical\n    values: [torch, deepgemm]\n    default: torch\n"
    )
    with pytest.raises(
        SpaceError,
        match=r"x.yaml: deployment sglang-0.5.23-dsv4 \(sparse_attention, .*\): names a knob "
        r"the space does not have \(got 'attention_impl'\); use one of \['indexer_impl'\]",
    ):
        load_space_text(text, source="x.yaml")


def test_an_unknown_deployment_map_is_one_error_line_naming_the_known_ones():
    text = (
        Path(load_space("dsv4_flash").source)
        .read_text()
        .replace("deployment: sglang-0.5.23-dsv4", "deployment: sglang-9.9")
    )
    with pytest.raises(
        SpaceError, match=r"unknown deployment map \(got 'sglang-9.9'\); use one of \['sglang-0.5.23-dsv4'\]"
    ):
        load_space_text(text, source="x.yaml")


def test_the_fidelity_lines_say_which_component_ran_sglangs_kernel_a_stand_in_or_neither():
    space = load_space("dsv4_flash")
    base = resolve(space, H200_ALL).defaults()
    lines = {line.split(":")[0].strip(): line for line in space.deployment.fidelity_lines("sm_90", base)}
    assert "SGLang's own kernel" in lines["indexer_logits"] and "SGLang's own kernel" in lines["sparse_attention"]
    assert "a stand-in for FlashInfer cutlass_fused_moe" in lines["routed_moe"]
    other = space.deployment.fidelity_lines("sm_90", {**base, "attention_impl": "wgmma", "kv_cache_dtype": "bf16"})
    assert any(
        line.startswith("  sparse_attention: the twin ran attention_impl=wgmma, kv_cache_dtype=bf16 (not SGLang's")
        for line in other
    )
    assert space.deployment.fidelity_lines(None, base) == []


def test_sglangs_jit_top_k_is_the_baseline_where_it_builds_and_torch_topk_is_a_code_change_on_sm90():
    from tuner.targets.workload.server_map import command_config

    space = load_space("dsv4_flash")
    with_jit = resolve(space, replace(H200_ALL, has_sglang_jit=True)).defaults()
    assert with_jit["indexer_impl"] == "deepgemm" and with_jit["indexer_topk"] == "sglang"
    without = resolve(space, H200_ALL)
    assert without.defaults()["indexer_impl"] == "deepgemm" and without.defaults()["indexer_topk"] == "torch"
    assert any("indexer_topk" in n and "sglang_jit" in n and "keeps the space's defaults" in n for n in without.notes)
    cfg = command_config(space, without.defaults(), "sm_90")
    change = next(c for c in cfg.changes if c.param == "indexer_topk")
    assert (change.value, change.instead) == ("torch", "sglang") and cfg.params["indexer_topk"] == "sglang"
    lines = space.deployment.fidelity_lines("sm_90", with_jit)
    assert any(ln.startswith("  indexer_topk: SGLang's own kernel") for ln in lines)
    lines = space.deployment.fidelity_lines("sm_90", without.defaults())
    assert any(ln.startswith("  indexer_topk: the twin ran indexer_impl=deepgemm, indexer_topk=torch") for ln in lines)


def test_an_installed_module_that_does_not_import_is_no_capability(tmp_path, monkeypatch):
    """A kernel wheel built for another torch is installed (``find_spec`` sees it) but fails on import: the probe the
    capability check runs on a GPU says no, so the baseline never picks a kernel that cannot load."""
    from search_spaces.hardware import imports

    (tmp_path / "broken_kernel_wheel.py").write_text("raise ImportError('undefined symbol: _ZN3c10...')\n")
    (tmp_path / "good_kernel_wheel.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert importlib.util.find_spec("json") is not None and imports("json")
    assert imports("good_kernel_wheel")
    assert not imports("broken_kernel_wheel")
    assert not imports("no_such_kernel_wheel")


H200_SGLANG = replace(H200_ALL, has_sglang_jit=True, has_sglang_triton=True)


def test_an_h200_with_sglangs_jit_runs_sglangs_own_glue_in_the_baseline_and_deepgemm_linears():
    space = load_space("dsv4_flash")
    base = resolve(space, H200_SGLANG).defaults()
    assert base["glue"] == "sglang" and base["gemm_impl"] == "deepgemm" and base["attention_impl"] == "flashmla_kv"
    assert not space.violated_constraints(base)
    lines = space.deployment.fidelity_lines("sm_90", base)
    glue = [ln for ln in lines if ln.strip().startswith("norm_rope_glue")]
    assert glue and "SGLang's own kernel" in glue[0]


def test_without_sglangs_jit_the_baseline_runs_the_labelled_triton_stand_in_for_the_glue_and_says_so():
    space = load_space("dsv4_flash")
    resolved = resolve(space, H200_ALL)  # FlashMLA and DeepGEMM, no SGLang JIT
    base = resolved.defaults()
    assert base["glue"] == "fused"
    note = [n for n in resolved.notes if "norm_rope_glue" in n]
    assert note and "sglang_jit" in note[0] and "stand-in glue=fused" in note[0]
    lines = space.deployment.fidelity_lines("sm_90", base)
    assert any(ln.strip().startswith("norm_rope_glue: a stand-in") for ln in lines)
    # the command stage keeps the stand-in rather than falling to eager torch glue
    cmd = resolve(space, H200_ALL, deployable_only=True)
    assert cmd.defaults()["glue"] == "fused"


def test_the_command_stage_on_an_h200_searches_sglangs_two_fp8_gemm_backends():
    space = load_space("dsv4_flash")
    cmd = resolve(space, H200_SGLANG, deployable_only=True)
    p = next((q for q in cmd.params if q.name == "gemm_impl"), None)
    assert p is not None and set(p.values) == {"deepgemm", "sglang_triton"}
    assert cmd.defaults()["glue"] == "sglang"  # the only glue the command runs here


def test_fp8_gemm_backend_flag_is_written_for_sglangs_triton_gemm_and_left_out_for_deepgemm():
    from tuner.targets.workload.server_map import command_config, server_launch

    space = load_space("dsv4_flash")
    base = resolve(space, H200_SGLANG).defaults()
    args = server_launch(space, {**base, "gemm_impl": "sglang_triton"}).args
    assert args[args.index("--fp8-gemm-backend") + 1] == "triton"
    assert "--fp8-gemm-backend" not in server_launch(space, base).args
    for own in ("torch", "triton", "auto"):  # the flag left at auto runs DeepGEMM on sm_90: the twin's own is a change
        cfg = command_config(space, {**base, "gemm_impl": own}, "sm_90")
        assert cfg.params["gemm_impl"] == "deepgemm" and [c.param for c in cfg.changes] == ["gemm_impl"]
    assert not command_config(space, {**base, "gemm_impl": "sglang_triton"}, "sm_90").changes
    on_cpu = command_config(space, resolve(space, Hardware()).defaults(), None)
    assert on_cpu.params["gemm_impl"] == "torch" and "gemm_impl" not in {c.param for c in on_cpu.changes}


def test_sglangs_dispatch_sends_fp8_gemm_backend_triton_to_its_triton_block_fp8_linear():
    root = _sglang_root()
    src = (root / "srt/layers/quantization/fp8_utils.py").read_text()
    explicit = src[src.index("def _dispatch_explicit_backend") :]
    explicit = explicit[: explicit.index("\ndef ", 1)]
    branch = explicit[explicit.index("elif backend.is_triton():") :]
    assert branch.split("\n")[1].strip() == "return triton_w8a8_block_fp8_linear"


def test_the_twins_block_fp8_linears_call_what_sglangs_dispatch_calls_for_v4s_ue8m0_checkpoint():
    """``tuner.targets.workload.sglang_gemm`` calls the quantisation that SGLang's two Hopper backends call for an
    ``act_scale_ue8m0`` checkpoint, from the module that defines it, and launches the Triton GEMM's kernels as SGLang's
    launcher does (the steps it repeats are still SGLang's)."""
    import ast
    import inspect

    from tuner.targets.workload import sglang_gemm

    root = _sglang_root()
    utils = (root / "srt/layers/quantization/fp8_utils.py").read_text()

    def body(name: str, rel: str | None = None) -> str:
        text = (root / rel).read_text() if rel else utils
        start = text.index(f"def {name}(")
        return text[start : text.index("\ndef ", start + 1)]

    quant_call = (
        "sglang_per_token_group_quant_fp8(\n                input_2d, block_size[1], scale_ue8m0=True\n            )"
    )
    assert quant_call in body("triton_w8a8_block_fp8_linear")
    assert "w8a8_block_fp8_matmul_triton(" in body("triton_w8a8_block_fp8_linear")
    deepgemm = body("deepgemm_w8a8_block_fp8_linear_with_fallback")
    assert "if get_platform().is_sm90 and act_scale_ue8m0:" in deepgemm
    assert (
        "sglang_per_token_group_quant_fp8(\n            input_2d, block_size[1], scale_ue8m0=True\n        )"
        in deepgemm
    )
    assert 'scale_fmt == "ue8m0"' in (root / "srt/layers/quantization/fp8.py").read_text()
    # the functions the twin imports exist where it imports them, and take what it passes
    defs = {}
    for rel in ("kernels/ops/quantization/fp8_kernel.py", "kernels/ops/gemm/fp8_kernel.py"):
        for node in ast.parse((root / rel).read_text()).body:
            if isinstance(node, ast.FunctionDef):
                defs[node.name] = [a.arg for a in node.args.args + node.args.kwonlyargs]
    assert {"x", "group_size", "scale_ue8m0"} <= set(defs["sglang_per_token_group_quant_fp8"])
    assert defs["w8a8_block_fp8_matmul_triton"][:6] == ["A", "B", "As", "Bs", "block_size", "output_dtype"]
    src = inspect.getsource(sglang_gemm)
    assert "from sglang.kernels.ops.quantization.fp8_kernel import sglang_per_token_group_quant_fp8" in src
    assert "from kernels.plugins.sglang_block_fp8 import block_fp8_matmul" in src  # fp8_kernel imports SGLang's runtime
    # the GEMM's launcher, which kernels.plugins.sglang_block_fp8 repeats for CUDA: its choices are still these
    launcher = body("w8a8_block_fp8_matmul_triton", "kernels/ops/gemm/fp8_kernel.py")
    for step in (
        "configs = get_w8a8_block_fp8_configs(N, K, block_size[0], block_size[1])",
        "config = configs[min(configs.keys(), key=lambda x: abs(x - M))]",
        '"BLOCK_SIZE_M": 64,',
        '"GROUP_SIZE_M": 32,',
        "hopper_tuned = get_platform().is_sm90 and (",
        'config.get("SWAP_AB", False) or config.get("SPLIT_K", 1) > 1',
        "kernel = _w8a8_block_fp8_matmul_hopper",
        "_reduce_block_fp8_split_k[(triton.cdiv(M * N, 256),)](",
        'needs_masking = bool(K % config["BLOCK_SIZE_K"] != 0)',
    ):
        assert step in launcher, step
    assert "srt.layers.quantization.fp8_utils import" not in src  # that module needs sgl_kernel


def test_without_sglangs_jit_quantisation_the_deepgemm_linear_says_so_and_sglang_triton_refuses(caplog, monkeypatch):
    import torch

    from tuner.errors import KnobError
    from tuner.targets.workload import sglang_gemm

    def broken(*args):
        raise ModuleNotFoundError("No module named 'tvm_ffi'")

    monkeypatch.setattr(sglang_gemm, "_sglang_quant_fn", broken)
    sglang_gemm.sglang_activation_quant.cache_clear()
    sglang_gemm._sglang_triton.cache_clear()
    try:
        with caplog.at_level("WARNING", logger=sglang_gemm.__name__):
            assert sglang_gemm.sglang_activation_quant() is None
        assert "quantise their activations in torch" in caplog.text and "tvm_ffi" in caplog.text
        with pytest.raises(KnobError, match=r"gemm_impl=sglang_triton.*(does not import|does not build)"):
            sglang_gemm.block_fp8_linear(torch.ones(1, 128), torch.ones(128, 128), torch.ones(1, 1))
    finally:
        sglang_gemm.sglang_activation_quant.cache_clear()
        sglang_gemm._sglang_triton.cache_clear()


def test_the_plugin_is_timed_at_the_objectives_batches_only_where_the_command_runs_sglangs_glue_on_a_gpu():
    from tuner.targets.workload.target import WorkloadTarget

    space = load_space("dsv4_flash")
    on_h200 = WorkloadTarget(resolve(space, H200_SGLANG), {})
    best = on_h200.resolved.defaults()
    (args,) = on_h200.plugin_measurements(best)
    assert args == ["--batches", "1", "16", "64", "--heads", "64", "--head-dim", "512", "--rope-dim", "64"] + [
        "--eps",
        "1e-06",
    ]
    without_jit = WorkloadTarget(resolve(space, replace(H200_ALL, has_sglang_jit=False)), {})
    assert without_jit.plugin_measurements(without_jit.resolved.defaults()) == []  # the command's glue is the fallback
    on_cpu = WorkloadTarget(resolve(space, Hardware()), {})
    assert on_cpu.plugin_measurements(on_cpu.resolved.defaults()) == []


def test_the_command_names_the_tuned_files_sglang_reads_on_its_paths_and_ships_moe_configs_only_where_read(tmp_path):
    from tuner.targets.workload.deploy import deployment

    space = load_space("dsv4_flash")
    base = resolve(space, H200_SGLANG).defaults()
    lines = deployment(space, base, "sm_90", None).lines
    reads = lines[lines.index("the tuned files SGLang reads on this command's paths:") + 1 :]
    moe = next(ln for ln in reads if ln.startswith("  routed_moe: "))
    assert "FlashInfer's autotuner" in moe and "not ahead of time by this tuner" in moe
    assert next(ln for ln in reads if ln.startswith("  fp8_linears: ")).startswith("  fp8_linears: none; DeepGEMM")
    assert "  fused-MoE Triton configs (SGLANG_MOE_CONFIG_DIR): not shipped" in "\n".join(lines)
    src = tmp_path / "kdir" / "configs" / "triton_3_6_0"
    src.mkdir(parents=True)
    (src / "E=256,N=2048,device_name=NVIDIA_H200.json").write_text("{}")
    assert not deployment(space, base, "sm_90", None).copy_configs([tmp_path / "kdir"], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # no folder, so launch.sh sets no SGLANG_MOE_CONFIG_DIR
    triton = deployment(space, {**base, "gemm_impl": "sglang_triton"}, "sm_90", None).lines
    ran = next(ln for ln in triton if ln.startswith("  fp8_linears: SGLang's own kernel"))
    assert ran.startswith("  fp8_linears: SGLang's own kernel (--fp8-gemm-backend triton), ")
    assert any("an export cannot ship tuned ones for this path" in ln for ln in triton)


def test_every_kernel_path_the_twin_runs_says_what_tuned_files_sglang_reads_there():
    from search_spaces.deployment import load_deployment

    dep = load_deployment("sglang-0.5.23-dsv4")
    assert {r.reads_env for r in dep.runs} == {"", "SGLANG_MOE_CONFIG_DIR"}
    assert all(r.reads for r in dep.runs if r.twin is not None and r.component not in ("kv_cache", "context_cap"))
