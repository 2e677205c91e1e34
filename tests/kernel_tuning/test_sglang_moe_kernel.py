"""SGLang's own fused-MoE kernel as a tunable kernel: loaded from the installed SGLang's source, checked against a
float64 reference in Triton's interpreter, tuned by a real kernel search, written as SGLang's files and read back
by SGLang's own loader; the SGLang target's kernel phase shapes and the export of those files."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from pathlib import Path

import pytest
import torch

from kernels.plugins.sglang_moe import SGLangFusedMoEKernel, SGLangKernelUnavailable, align_block_size, load_sglang_jit
from kernels.plugins.sglang_moe_files import read_moe_config_with_sglang
from search_spaces import Hardware, load_space, load_space_text, resolve

if importlib.util.find_spec("sglang") is None:  # CI installs it (no deps); its kernel source is all this needs
    pytest.skip("sglang is not installed (`pip install sglang --no-deps`)", allow_module_level=True)
KERNEL = SGLangFusedMoEKernel.instance
SMALL = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2}


@pytest.fixture
def kernel_device():
    """Kernel runs need CUDA or Triton's interpreter, switched on by this folder's conftest before Triton loads."""
    import triton

    if torch.cuda.is_available():
        return "cuda"
    if not triton.knobs.runtime.interpret:
        pytest.skip("Triton was imported before TRITON_INTERPRET=1 was set; run this file on its own")
    return "cpu"


def test_alignment_is_sglangs_documented_layout():
    """The example of SGLang's moe_align_block_size docstring (experts shifted to start at 0)."""
    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]]) - 1
    sorted_ids, expert_ids, ntp = align_block_size(ids, 4, 4)
    assert sorted_ids[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]
    assert (sorted_ids[16:] == 12).all() and sorted_ids.numel() == 12 + 5 * 3 + 1  # SGLang's size, rounded to 4
    assert expert_ids.tolist()[:4] == [0, 1, 2, 3] and (expert_ids[4:] == -1).all()
    assert ntp.tolist() == [16]


@pytest.mark.parametrize("config", [None, SMALL, dict(SMALL, BLOCK_SIZE_M=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=8)])
@pytest.mark.parametrize("shape", KERNEL.shapes("test"), ids=["3tok", "9tok"])
def test_sglangs_kernel_matches_the_float64_reference(kernel_device, shape, config):
    from kernels.base import check

    err = check(KERNEL, shape, "float16", config, device=kernel_device, seed=3)  # NaN-poisoned out, fresh random inputs
    assert err < KERNEL.tolerance("float16"), err


def test_a_wrong_routing_is_caught_by_the_reference(kernel_device):
    shape = KERNEL.shapes("test")[0]
    inputs = KERNEL.make_inputs(shape, "float16", kernel_device, seed=5)
    out = KERNEL.run(inputs, SMALL)
    inputs["ids"] = inputs["ids"].flip(1)  # same experts, swapped routing weights
    from kernels.base import rel_error

    assert rel_error(out, KERNEL.reference(inputs)) > 10 * KERNEL.tolerance("float16")


def test_the_loaded_kernel_is_sglangs_own_source():
    import inspect

    fn = load_sglang_jit("fused_moe_kernel")["fused_moe_kernel"]
    path = Path(fn.fn.__code__.co_filename)
    assert path.parts[-4:] == ("kernels", "ops", "moe", "fused_moe_triton_kernels.py")
    assert inspect.getsource(fn.fn) in path.read_text()


def test_an_unknown_sglang_kernel_is_refused_with_its_parameters(tmp_path):
    src = tmp_path / "k.py"
    src.write_text("import triton\n\n@triton.jit\ndef fused_moe_kernel(a_ptr, NEW_KNOB: tl.constexpr):\n    pass\n")
    with pytest.raises(SGLangKernelUnavailable, match=r"\['NEW_KNOB'\].*0\.5\.23"):
        load_sglang_jit("fused_moe_kernel", path=src)
    with pytest.raises(SGLangKernelUnavailable, match="no @triton.jit function 'other'"):
        load_sglang_jit("other", path=src)
    from kernels.plugins.sglang_moe import _KNOWN_ARGS

    renamed = tmp_path / "renamed.py"  # a release that dropped one parameter the launcher passes
    renamed.write_text(
        "import triton\n\n@triton.jit\ndef fused_moe_kernel("
        + ", ".join(a for a in _KNOWN_ARGS if a != "even_Ks")
        + "):\n    pass\n"
    )
    with pytest.raises(SGLangKernelUnavailable, match=r"parameters \[\] .* lacks \['even_Ks'\]"):
        load_sglang_jit("fused_moe_kernel", path=renamed)


def test_rules_keep_the_default_and_prune_what_cannot_help():
    for shape in KERNEL.shapes("v4flash") + KERNEL.shapes("test"):
        assert KERNEL.check_config(KERNEL.default_config(shape), shape) is None, shape
    one = KERNEL.shapes("v4flash")[0]  # one token: 6 pairs
    assert KERNEL.check_config(dict(SMALL, BLOCK_SIZE_M=128), one).startswith("block_m")
    # 6 pairs, 32 experts, BLOCK_SIZE_M 16: 6*16 rows = 6 blocks, so any group above 1... of 8 acts as 8
    assert KERNEL.check_config(dict(SMALL, GROUP_SIZE_M=16), one).startswith("group_m_moot")
    assert KERNEL.check_config(dict(SMALL, GROUP_SIZE_M=8), one) is None
    big = dict(SMALL, BLOCK_SIZE_M=64, BLOCK_SIZE_N=256, BLOCK_SIZE_K=256, num_stages=5)
    assert KERNEL.check_config(big, KERNEL.shapes("v4flash")[2]).startswith("shared_memory")
    n = len(list(KERNEL.configs(one)))
    assert 100 < n < 2560  # the rules prune part of the 2560-config space, not all of it


def test_server_files_are_read_back_by_sglangs_own_loader(tmp_path):
    shapes = [dict(KERNEL.shapes("v4flash")[0], tokens=t) for t in (1, 16)]
    configs = [SMALL, dict(SMALL, BLOCK_SIZE_M=32, num_warps=8)]
    paths = KERNEL.write_server_configs(
        [(s, {"config": c}) for s, c in zip(shapes, configs)], "NVIDIA H200", "bfloat16", tmp_path
    )
    assert [p.name for p in paths] == ["E=32,N=2048,device_name=NVIDIA_H200.json"]
    root = tmp_path / "sglang_moe"
    assert read_moe_config_with_sglang(root, E=32, N=2048, device_name="NVIDIA H200") == {1: configs[0], 16: configs[1]}
    # a later phase adds a batch size and keeps the others
    KERNEL.write_server_configs([(dict(shapes[0], tokens=64), {"config": SMALL})], "NVIDIA H200", "bfloat16", tmp_path)
    assert sorted(read_moe_config_with_sglang(root, E=32, N=2048, device_name="NVIDIA H200")) == [1, 16, 64]
    # float32 is not a dtype SGLang's unquantized MoE file describes: nothing written
    assert KERNEL.write_server_configs([(shapes[0], {"config": SMALL})], "x", "float32", tmp_path / "f") == []


def test_a_kernel_search_tunes_sglangs_kernel_and_writes_its_files(kernel_device, tmp_path, sqlite_url):
    """Real sub-study, real subprocess trials in the interpreter: the default is enqueued first, rules prune,
    the files in tuner's and SGLang's formats are written."""
    from kernels.configs import config_path, read_config_file
    from storage import Repo
    from tuner.search.context import SearchOptions
    from tuner.search.kernel_search import KernelCase, tune_cases

    shape = KERNEL.shapes("test")[0]
    opts = SearchOptions(
        budget_s=120,
        storage_url=sqlite_url,
        out_dir=str(tmp_path / "out"),
        seed=1,
        hardware=Hardware(),
        settings={"allow_cpu_interpreter": True, "dtype": "float16"},
        confirm_top=0,
        n_trials=4,
    )
    res = tune_cases([KernelCase("sglang_fused_moe", shape, "float16")], opts, study="sg")
    case = res.cases[0]
    assert case.status in ("tuned", "default_kept"), case
    trials = Repo(sqlite_url).list_trials(Repo(sqlite_url).get_run(case.study).id)
    assert trials[0].params == KERNEL.default_config(shape) and trials[0].outcome == "ok"
    entry = read_config_file(config_path("sglang_fused_moe", "cpu", "float16", directory=Path(res.config_dir)))
    assert entry[case.shape_key]["config"] == case.config
    read = read_moe_config_with_sglang(Path(res.config_dir) / "sglang_moe", E=5, N=32, device_name="cpu")
    assert read == {3: case.config}


def test_preflight_names_a_missing_sglang(monkeypatch):
    import kernels.plugins.sglang_moe as sm
    from tuner.targets.kernels import KernelsTarget

    def missing():
        raise SGLangKernelUnavailable("sglang is not installed; `pip install sglang --no-deps` gives its kernel")

    monkeypatch.setattr(sm, "_source_path", missing)
    monkeypatch.setattr(sm, "_LOADED", {})
    space = load_space_text(
        "name: k\ntarget: kernels\nsettings: {kernel: sglang_fused_moe, shape: {tokens: 3, hidden: 64, width: 32, "
        "experts: 5, topk: 2}, allow_cpu_interpreter: true}\nobjective: {metric: time_us, direction: minimize, "
        "combine: level, levels: [1], level: 1}\nparams:\n  BLOCK_SIZE_M: {type: categorical, values: [16], "
        "default: 16}\n"
    )
    report = KernelsTarget(resolve(space, Hardware()), space.settings).preflight()
    assert any("sglang_fused_moe" in e and "pip install sglang --no-deps" in e for e in report.errors), report.errors


# -- the SGLang target's kernel phase ------------------------------------------------------------------------
def _target(settings=None, hardware=None):
    from tuner.targets.server.sglang_server import SGLangTarget

    space = load_space("sglang_dsv4_flash")
    return SGLangTarget(resolve(space, hardware or Hardware()), {**space.settings, **(settings or {})})


def test_kernel_phase_shapes_follow_the_launch_flags():
    # one GPU: tp_size is dropped (needs several GPUs), so SGLang's default TP 1 holds every expert whole
    one = _target()
    assert {(s["experts"], s["width"]) for _, s in one.kernel_shapes()} == {(256, 2048)}
    assert sorted(s["tokens"] for _, s in one.kernel_shapes()) == [1, 16, 64]
    # eight GPUs: tp_size 4 or 8 splits every expert's width
    eight = _target(hardware=Hardware(gpu_count=8, gpu_name="NVIDIA H200"))
    assert {(s["experts"], s["width"]) for _, s in eight.kernel_shapes()} == {(256, 512), (256, 256)}
    # expert parallel in the fixed flags: 32 whole experts per rank
    ep = _target({"extra_args": ["--tp-size", "8", "--ep-size=8"]})
    assert {(s["experts"], s["width"]) for _, s in ep.kernel_shapes()} == {(32, 2048)}
    assert _target({"moe": None}).kernel_shapes() == []
    from tuner.errors import TargetError

    with pytest.raises(TargetError, match="setting `moe` must map hidden, width, experts and topk"):
        _target({"moe": {"hidden": 4096}}).kernel_shapes()
    with pytest.raises(TargetError, match="--ep-size without an integer"):
        _target({"extra_args": ["--tp-size", "8", "--ep-size"]}).kernel_shapes()


def test_phase_files_go_to_every_later_launch_and_the_export(tmp_path, sqlite_url):
    from storage import Repo
    from tuner.export.script import export_run

    conf = tmp_path / "kc"
    KERNEL.write_server_configs([(KERNEL.shapes("v4flash")[0], {"config": SMALL})], "NVIDIA H200", "bfloat16", conf)
    t = _target()
    added = t.use_kernel_configs(str(conf))
    assert added == {"moe_config_dir": str(conf / "sglang_moe")}
    t = _target(added)  # every later trial's target is built from the settings the phase added
    spec = t.launch_spec(load_space("sglang_dsv4_flash").defaults())
    assert spec.env["SGLANG_MOE_CONFIG_DIR"] == str(conf / "sglang_moe")
    assert _target({"moe_config_dir": "/mine"}).use_kernel_configs(str(conf)) == {}  # the user's folder wins

    repo = Repo(sqlite_url)
    repo.create_schema()
    space = load_space("sglang_dsv4_flash")
    run = repo.create_run(
        "sg", target="sglang", budget_s=60, objective="geomean tok_s", space_name=space.name, settings=t.settings
    )
    repo.start_trial(run.id, 0, space.defaults(), is_baseline=True)
    assert repo.finish_trial(run.id, 0, outcome="ok", value=10.0)
    dest = export_run(repo, "sg", tmp_path / "export", target=t)
    script = (dest / "launch.sh").read_text()
    assert 'export SGLANG_MOE_CONFIG_DIR="$HERE/sglang_moe_configs"' in script
    assert str(conf) not in script
    copied = list((dest / "sglang_moe_configs").rglob("*.json"))
    assert [p.name for p in copied] == ["E=32,N=2048,device_name=NVIDIA_H200.json"]
    assert json.loads(copied[0].read_text()) == {"1": SMALL}
    assert os.stat(dest / "launch.sh").st_mode & stat.S_IXUSR


def test_a_system_search_hands_the_phase_files_to_later_trials(tmp_path, sqlite_url, monkeypatch):
    """``_maybe_kernel_phase`` on a GPU host: the target's shapes go to the phase, and the settings its
    ``use_kernel_configs`` returns reach the options every later trial worker is built from."""
    import dataclasses

    import tuner.search.driver as driver
    from tuner.search.context import SearchOptions, open_context
    from tuner.search.driver import _maybe_kernel_phase

    space = tmp_path / "fake.yaml"
    space.write_text(
        "name: fake\ntarget: fake_targets:FakeTarget\nsettings: {kernel_phase: true}\n"
        "objective: {metric: tok_s, combine: geomean, levels: [1, 4]}\n"
        "params:\n  x: {type: categorical, values: [0, 1], default: 0}\n"
    )
    gpu = Hardware(gpu_name="NVIDIA H200", gpu_count=1, compute_capability=(9, 0), has_triton=True)
    ctx = open_context(
        SearchOptions(
            budget_s=60, storage_url=sqlite_url, out_dir=str(tmp_path / "out"), space_path=str(space), hardware=gpu
        )
    )
    conf = tmp_path / "kc"
    KERNEL.write_server_configs([(KERNEL.shapes("v4flash")[0], {"config": SMALL})], "NVIDIA H200", "bfloat16", conf)
    seen = []

    def phase(ctx_, shapes, budget_s, progress=None):
        seen.append(shapes)
        return dataclasses.make_dataclass("R", [("config_dir", str)])(str(conf))

    monkeypatch.setattr(driver, "kernel_phase", phase)
    sg = _target()
    monkeypatch.setattr(ctx.target, "kernel_shapes", sg.kernel_shapes, raising=False)
    monkeypatch.setattr(ctx.target, "use_kernel_configs", sg.use_kernel_configs, raising=False)
    _maybe_kernel_phase(ctx, None)
    assert [s["tokens"] for _, s in seen[0]] == [1, 16, 64]  # the SGLang space's levels
    assert ctx.options.settings["moe_config_dir"] == str(conf / "sglang_moe")
    assert ctx.target.settings["moe_config_dir"] == str(conf / "sglang_moe")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 at DeepSeek-V4-Flash shapes: needs CUDA")
def test_gpu_sglangs_kernel_at_v4_flash_shapes_and_compiled_ahead(tmp_path, monkeypatch):
    """bf16 at the EP-8 and TP-8 shapes: default and two other configs within tolerance of the float32
    reference; a helper compiles from meta tensors what a fresh process then loads without compiling."""
    from compile_check import assert_compiled_ahead_then_loaded

    from kernels.base import check

    shapes = KERNEL.shapes("v4flash") + [{"tokens": 16, "hidden": 4096, "width": 256, "experts": 256, "topk": 6}]
    for shape in shapes:
        for config in [
            None,
            dict(SMALL, BLOCK_SIZE_N=64, BLOCK_SIZE_K=128, num_stages=3),
            dict(SMALL, BLOCK_SIZE_M=64, BLOCK_SIZE_N=128, BLOCK_SIZE_K=64, num_warps=8, num_stages=4),
        ]:
            err = check(KERNEL, shape, "bfloat16", config, device="cuda", seed=7)
            assert err < KERNEL.tolerance("bfloat16"), (shape, config, err)
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    configs = [dict(SMALL, num_stages=4), dict(SMALL, BLOCK_SIZE_N=64, num_warps=8)]
    assert_compiled_ahead_then_loaded("sglang_fused_moe", KERNEL.shapes("v4flash")[1], configs, cache)


def test_timing_rotates_several_routings_over_shared_weights(kernel_device):
    from tuner.targets.kernels import ROTATE_MAX, KernelsTarget

    shape = KERNEL.shapes("test")[1]
    a, b = KERNEL.make_inputs(shape, "float16", "cpu", 1), KERNEL.make_inputs(shape, "float16", "cpu", 2)
    assert a["w1"] is b["w1"] and not torch.equal(a["ids"], b["ids"])
    space = load_space_text(
        "name: k\ntarget: kernels\nsettings: {kernel: sglang_fused_moe, shape: {tokens: 9, hidden: 96, width: 48, "
        "experts: 4, topk: 3}, allow_cpu_interpreter: true, dtype: float16}\nobjective: {metric: time_us, "
        "direction: minimize, combine: level, levels: [1], level: 1}\nparams:\n  BLOCK_SIZE_M: {type: categorical, "
        "values: [16], default: 16}\n"
    )
    target = KernelsTarget(resolve(space, Hardware()), space.settings)
    assert target._time(KERNEL.default_config(shape), kernel_device)["sets"] == ROTATE_MAX


def test_a_file_sglang_would_read_differently_is_reported_not_returned(tmp_path, monkeypatch, caplog):
    import kernels.plugins.sglang_moe as plugin

    monkeypatch.setattr(plugin, "read_moe_config_with_sglang", lambda root, **kw: {1: dict(SMALL, num_warps=8)})
    with caplog.at_level("ERROR"):
        paths = KERNEL.write_server_configs(
            [(KERNEL.shapes("v4flash")[0], {"config": SMALL})], "NVIDIA H200", "bfloat16", tmp_path
        )
    assert paths == [] and "SGLang will not use these configs" in caplog.text
