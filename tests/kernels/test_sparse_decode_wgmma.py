"""The Gluon wgmma sparse-decode kernel (kernels/sparse_decode_wgmma/).

On any machine: its launcher rejects what it cannot run with a one-line error, and it compiles for sm_90 with the
schedule its docstring states (wgmma products, cp.async gathers, no spills). On an sm_90 GPU: it matches the
float32 reference into NaN-poisoned outputs at V4-Flash shapes, ragged padding, every split and ring depth.
"""

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import get_kernel
from kernels.base import rel_error
from kernels.sparse_decode_wgmma import DEFAULT_CONFIG, HAVE_GLUON, sparse_decode_wgmma

ROOT = Path(__file__).resolve().parents[2]
SD = get_kernel("sparse_decode")
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_gluon = pytest.mark.skipif(not HAVE_GLUON, reason="this Triton has no Gluon Hopper API")


def _inputs(batch, dtype=torch.bfloat16, heads=64, d=512, topk=640, rows=4096, device="cpu"):
    q = torch.randn(batch, heads, d, dtype=dtype, device=device)
    kv = torch.randn(rows, d, dtype=dtype, device=device)
    idx = torch.randint(0, rows, (batch, topk), dtype=torch.int32, device=device)
    return q, kv, idx


def _sm90_build(shape: dict, config: dict, ptxas_log: bool = False, kwargs: dict | None = None) -> dict:
    """compile_probe.py's report of the kernel's sm_90 build (PTX instruction counts, registers, local memory), from
    a subprocess without TRITON_INTERPRET; with ``ptxas_log``, freshly compiled and with ptxas's ``-v`` log (what
    Triton prints before the report) under ``"ptxas_log"``; ``kwargs``: more keyword arguments of the launch."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TRITON_INTERPRET", None)
    if ptxas_log:
        env.update(TRITON_DUMP_PTXAS_LOG="1", TRITON_ALWAYS_COMPILE="1")
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "kernels" / "compile_probe.py"),
            "wgmma",
            json.dumps(shape),
            json.dumps(config),
            json.dumps(kwargs or {}),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    return {**json.loads(lines[-1]), **({"ptxas_log": "\n".join(lines[:-1])} if ptxas_log else {})}


@needs_gluon
@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"heads": 128}, "heads=128 (at most 64)"),
        ({"d": 256}, "d_qk=256, d_v=256 (both 512)"),
        ({"dtype": torch.float32}, "dtype torch.float32 (bfloat16 or float16)"),
    ],
    ids=["heads", "width", "dtype"],
)
def test_sparse_decode_wgmma_rejects_shapes_it_cannot_run_with_one_line(change, fragment):
    with pytest.raises(ValueError) as err:
        sparse_decode_wgmma(*_inputs(1, **change))
    assert fragment in str(err.value) and "use kernels.sparse_decode.sparse_decode" in str(err.value)
    assert "\n" not in str(err.value)


@needs_gluon
def test_sparse_decode_wgmma_asks_an_fp8_cache_for_its_row_scales():
    q, kv, idx = _inputs(1)
    with pytest.raises(
        ValueError,
        match=r"an fp8 kv cache needs kv_scale: float32 \[4096\] \(one scale per row\), "
        r"got None",
    ):
        sparse_decode_wgmma(q, kv.to(torch.float8_e4m3fn), idx)


FP8 = "float8_e4m3fn"
V4 = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}


@needs_gluon
@pytest.mark.parametrize(
    "config, rule",
    [
        (
            {"S": 4, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 2, "WS": 0},
            r"fp8_cache: an fp8 cache needs the producer warpgroup that widens its rows \(WS=1 or SPLIT_WG=1\); "
            r"got WS=0",
        ),
        (
            {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1},
            r"shared_memory: an fp8 cache needs two staging slots of 32 KiB beside 196 KiB \(at most 227 KiB\); lower "
            r"STAGES or BLOCK_T",
        ),
    ],
    ids=["no-producer", "no-room"],
)
def test_an_fp8_config_without_a_producer_or_room_for_two_staging_slots_is_refused_in_one_line(config, rule):
    k = get_kernel("sparse_decode_wgmma")
    config = {**DEFAULT_CONFIG, **config}
    why = k.check_config(config, V4, None, FP8)
    assert re.fullmatch(rule, why), why
    assert k.check_config(config, V4, None, "bfloat16") is None  # a 16-bit cache runs it


@needs_gluon
def test_fit_dtype_gives_every_default_and_tuned_config_an_fp8_producer_and_leaves_16_bit_configs_alone():
    """Every batch's default and the H200's tuned bf16 configs, made fit for an fp8 cache, pass the fp8 rules: a
    producer warpgroup (WS where there was none), 32-row tiles where 64-row ones leave no room for two staging
    slots, the ring cut (evenly with SPLIT_WG) only as far as needed; bf16 configs come back unchanged."""
    from kernels.sparse_decode_wgmma import fp8_stages

    k = get_kernel("sparse_decode_wgmma")
    files = sorted((ROOT / "kernels" / "tuned").glob("sparse_decode_wgmma__NVIDIA_H200__bfloat16__*.json"))
    assert files, "the H200's tuned bf16 file"
    tuned = json.loads(files[-1].read_text())
    cases = [(dict(V4, batch=b), k.default_config(dict(V4, batch=b))) for b in range(1, 133)]
    cases += [
        (dict(V4, batch=int(key.split("batch=")[1].split(",")[0])), {**DEFAULT_CONFIG, **e["config"]})
        for key, e in tuned.items()
    ]
    for shape, config in cases:
        assert k.fit_dtype(config, shape, "bfloat16") is config
        fit = k.fit_dtype(config, shape, FP8)
        assert k.check_config(fit, shape, None, FP8) is None, (shape["batch"], config, fit)
        assert fp8_stages(fit, shape) >= 2
        assert fit["WS"] == 1 and fit["S"] == config["S"] and fit["V_SPLIT"] == config["V_SPLIT"]
        assert fit["BLOCK_T"] == (config["BLOCK_T"] if fp8_stages({**config, "WS": 1, "STAGES": 2}, shape) >= 2 else 32)
        if k.check_config({**config, "WS": 1}, shape, None, FP8) is None:  # fits as it is: nothing cut
            assert fit == {**config, "WS": 1}


@needs_gluon
def test_the_tuned_lookup_of_an_fp8_cache_gives_the_wgmma_kernel_a_config_it_can_run(tmp_path, monkeypatch):
    """No fp8 file for the wgmma kernel: the lookup's default is made fit for fp8 (kernels.configs.lookup calls
    fit_dtype), not the bf16 default, which has no producer at batch 1."""
    from kernels.configs import clear_cache, lookup

    monkeypatch.setenv("TUNER_KERNEL_CONFIG_DIR", str(tmp_path))
    clear_cache()
    try:
        k = get_kernel("sparse_decode_wgmma")
        shape = dict(V4, batch=1)
        assert k.default_config(shape)["WS"] == 0
        got = lookup("sparse_decode_wgmma", shape, FP8)
        assert k.check_config(got, shape, None, FP8) is None and got["WS"] == 1
        assert lookup("sparse_decode_wgmma", shape, "bfloat16") == k.default_config(shape)
    finally:
        clear_cache()


@pytest.mark.slow  # sm_90 builds through ptxas in a subprocess: 3-19 s each on a 2-core CPU
@needs_gluon
@pytest.mark.parametrize(
    "config",
    [
        {"S": 10, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 8, "WS": 1},
        {"S": 1, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 1, "STORE_CVT": 1},
    ],
    ids=["ws-v8", "split-wg-table"],
)
def test_an_fp8_cache_compiles_to_staged_row_and_scale_copies_widened_by_the_producer_without_spills(config):
    """The fp8 build for sm_90: the producer copies 16 bytes of fp8 a thread and each row's 4-byte scale by cp.async
    into its staging ring and waits on its own copy groups (the 16-bit ring's copies arrive on mbarriers instead; q
    too, which is widened in place here), widens the rows with one cvt for two values (e4m3 to float16, no float32
    round trip); the consumers still run wgmma; no local memory; the shared memory rule (the 16-bit schedule's
    bytes plus the staging slots and the ring's row scales) bounds the build."""
    from kernels.sparse_decode_wgmma import fp8_stages, smem_limit

    k = get_kernel("sparse_decode_wgmma")
    config = {**DEFAULT_CONFIG, **config}
    shape = dict(V4, batch=64 if config.get("SPLIT_WG") else 16)
    fp8, bf16 = (_sm90_build(shape, config, kwargs={"kv_fp8": f}) for f in (True, False))
    assert fp8["ptx"]["cp.async.4B"] > 0 and bf16["ptx"].get("cp.async.4B", 0) == 0, fp8["ptx"]
    assert fp8["ptx"]["copy_arrive"] == 0 and bf16["ptx"]["copy_arrive"] == 2, (fp8["ptx"], bf16["ptx"])
    assert fp8["ptx"]["copy_wait_group"] > 0 and bf16["ptx"]["copy_wait_group"] == 0
    assert fp8["ptx"]["cvt.f16x2.e4m3x2"] > 0 and fp8["ptx"]["cvt.f32.f16"] == 0, fp8["ptx"]
    assert fp8["ptx"]["wgmma"] == bf16["ptx"]["wgmma"] > 0
    assert fp8["usage"]["local"] == 0, fp8["usage"]
    staging = (
        fp8_stages(config, shape) * config["BLOCK_T"] * (512 + 4)  # the staging ring, its scales
        + config["STAGES"] * config["BLOCK_T"] * 4
    )  # and the 16-bit ring's row scales
    assert fp8["shared_bytes"] <= k.smem_bytes(config, shape) + staging <= fp8["shared_bytes"] + 4096
    assert fp8["shared_bytes"] <= smem_limit()


@needs_gluon
@pytest.mark.parametrize(
    "config, rule",
    [
        ({"BLOCK_T": 16}, r"block_t: BLOCK_T=16 must be one of \(32, 64\)"),
        ({"STAGES": 1}, r"stages: STAGES=1"),
        ({"S": 0}, "positive_int: S=0"),
        ({"V_SPLIT": 3}, r"v_split: V_SPLIT=3 must be one of \(1, 2, 4, 8\)"),
        ({"STORE_CVT": 2}, "switch: STORE_CVT=2"),
        ({"num_warps": 4}, r"unknown_param: \['num_warps'\]"),
        ({"STAGES": 3, "BLOCK_T": 64}, "shared_memory: 260 KiB > 227 KiB"),
        ({"SPLIT_WG": 1, "V_SPLIT": 1}, r"split_wg: SPLIT_WG=1 needs V_SPLIT >= 2 .*got V_SPLIT=1, STAGES=2"),
        (
            {"SPLIT_WG": 1, "V_SPLIT": 2, "STAGES": 3, "BLOCK_T": 32},
            r"split_wg: .*an even ring .*got V_SPLIT=2, STAGES=3",
        ),
        ({"SPLIT_WG": 2}, "switch: SPLIT_WG=2 must be 0 or 1"),
        ({"SEESAW": 1}, r"unknown_param: \['SEESAW'\]"),
        ({"MERGE": 0}, r"unknown_param: \['MERGE'\]"),
        ({"P_SMEM": 0, "PART16": 0}, r"unknown_param: \['PART16', 'P_SMEM'\]"),
    ],
    ids=str,
)
def test_sparse_decode_wgmma_rejects_a_config_outside_its_space_in_one_line_naming_the_rule(config, rule):
    from kernels.base import InvalidConfig

    with pytest.raises(InvalidConfig, match=r"sparse_decode_wgmma: config .* cannot run for shape .*: " + rule) as err:
        sparse_decode_wgmma(*_inputs(1), config=config)
    assert "\n" not in str(err.value)


def test_the_wgmma_kernel_is_registered_tunable_and_says_why_it_cannot_run_here():
    """The kernel search and tuned-config files see it as ``sparse_decode_wgmma``: its default passes its rules at
    every V4-Flash batch, configs that launch the same program share one canonical form, and on a machine without
    an sm_90 GPU (or without Gluon) it names the reason instead of running."""
    from kernels.registry import get_kernel

    k = get_kernel("sparse_decode_wgmma")
    for shape in k.shapes("v4flash") + k.shapes("test"):
        assert k.check_config(k.default_config(shape), shape) is None
    b16 = k.shapes("v4flash")[1]
    base = {"BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "STORE_CVT": 0, "WS": 0, "SPLIT_WG": 0}
    assert k.canonical_config({**base, "S": 16}, b16) == {**base, "S": 10}  # ten 64-row splits either way
    assert k.canonical_config({**base, "S": 4}, b16) == {**base, "S": 4}
    assert k.canonical_config({**base, "S": 4, "V_SPLIT": 2, "SPLIT_WG": 1}, b16)["WS"] == 1  # warp-specialised anyway
    assert k.check_config({**base, "S": 4, "heads": 1}, b16).startswith("unknown_param")
    assert k.check_config({**base, "S": 4}, {**b16, "heads": 128}).startswith("heads: 128 > 64")
    if not (HOPPER and HAVE_GLUON):
        assert k.unavailable() and (
            "sm_90" in k.unavailable() or "9.0" in k.unavailable() or "Gluon" in k.unavailable()
        )
    else:
        assert k.unavailable() is None
    with pytest.raises(ValueError, match="unknown preset 'v32' for sparse_decode_wgmma"):
        k.shapes("v32")


def test_the_split_kernel_starts_its_merge_early_only_while_the_merge_fits_the_sms_it_leaves_idle():
    """Batch 1's default (80 programs, a merge of 128 programs, 52 idle SMs of 132) starts it early; batch 16's (128
    programs, a merge of 1024 on 4 idle SMs) and a split kernel of more programs than SMs do not."""
    from kernels.sparse_decode_wgmma import EARLY_MERGE_PER_IDLE_SM, merge_starts_early

    assert merge_starts_early(80, 128, 132)
    assert not merge_starts_early(128, 1024, 132)
    assert not merge_starts_early(132, 1, 132) and not merge_starts_early(192, 64, 132)
    assert merge_starts_early(100, EARLY_MERGE_PER_IDLE_SM * 32, 132)
    assert not merge_starts_early(100, EARLY_MERGE_PER_IDLE_SM * 32 + 1, 132)


@pytest.mark.slow  # sm_90 builds through ptxas in a subprocess: 3-19 s each on a 2-core CPU
@needs_gluon
@pytest.mark.parametrize(
    "config",
    [
        {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "WS": 0},  # batch 1's default: the single-partition kernel
        {"S": 4, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 1},  # warp-specialised
    ],
    ids=["plain", "split_wg"],
)
def test_sparse_decode_wgmma_split_kernel_starts_its_pdl_merge_early_only_when_the_merge_waits_for_it(config):
    """With ``pdl`` the merge kernel is launched with programmatic dependent launch (it waits in-kernel for the split
    kernel's stores) and, at batch 1 (few programs, a small merge: ``merge_starts_early``), the split kernel lets it
    start at once (one ``griddepcontrol.launch_dependents`` in its sm_90 PTX). Without ``pdl``, at batch 16 by the
    rule, or with one split (no merge kernel follows), the split kernel has none."""
    b1 = {"batch": 1, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    b16 = {**b1, "batch": 16}
    cases = [
        (b1, {"pdl": True}, config, 1, True),
        (b1, {"pdl": False}, config, 0, False),
        (b16, {"pdl": True}, config, 0, True),
    ]
    if not config.get("SPLIT_WG"):
        cases.append((b1, {"pdl": True}, {**config, "S": 1, "V_SPLIT": 2}, 0, None))  # one split: the output directly
    for shape, kwargs, cfg, triggers, merge_pdl in cases:
        got = _sm90_build(shape, cfg, kwargs=kwargs)
        where = (shape["batch"], kwargs, cfg)
        assert got["ptx"]["griddepcontrol.launch_dependents"] == triggers, (where, got["ptx"])
        assert got["merge_launch_pdl"] is merge_pdl, (where, got["merge_launch_pdl"])


@pytest.mark.slow  # sm_90 builds through ptxas in a subprocess: 3-19 s each on a 2-core CPU
@needs_gluon
def test_sparse_decode_wgmma_compiles_for_sm90_to_wgmma_and_cp_async_without_spills():
    """The schedule the module states, in its sm_90 PTX: wgmma for both products, the gathers as 16-byte cp.async
    (each BLOCK_T x 512 bf16 tile: BLOCK_T * 64 copies over 256 threads), and no local memory (no spill). With
    V_SPLIT=2 the copies are rotated by the program's first column of V, and must stay 16 bytes wide."""
    for config in (
        {"S": 5, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 0},
        {"S": 1, "BLOCK_T": 32, "STAGES": 4, "WS": 0},
        {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 0},
    ):  # the single-partition kernel
        shape = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
        got = _sm90_build(shape, config)
        ptx = got["ptx"]
        assert ptx["wgmma"] > 0 and ptx["mma.sync"] == 0, ptx
        assert ptx["cp.async.16B"] > 0 and ptx["ld.global.v4"] == 0, ptx  # q too arrives by cp.async
        assert not [k for k in ptx if k.startswith("cp.async.") and k != "cp.async.16B"], ptx  # no narrower copy
        assert got["usage"] is not None, "cuobjdump did not report the cubin's resource usage"
        assert got["usage"]["local"] == 0 and got["usage"]["stack"] == 0, got["usage"]  # no spill


@pytest.mark.slow  # sm_90 builds through ptxas in a subprocess: 3-19 s each on a 2-core CPU
@needs_gluon
@pytest.mark.parametrize(
    "config",
    [
        {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8},
        {"S": 20, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 4, "STORE_CVT": 1},
        {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2},
    ],
    ids=["v8", "v4-ring4-cvt", "v2"],
)
def test_sparse_decode_wgmma_ws_compiles_to_a_producer_warpgroup_and_mbarriers_without_spills(config):
    """WS=1's sm_90 build: the gathers leave the compute warps. A producer warpgroup gives up registers
    (setmaxnreg) and its 16-byte copies arrive on mbarriers as they land (cp.async.mbarrier.arrive); the consumer
    warpgroups wait on mbarriers (try_wait), and no thread waits on its own copy group (cp.async.wait_group: the
    single-partition kernel's wait). 384 threads at the launch's register cap, no spill."""
    shape = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    got = {ws: _sm90_build(shape, {**config, "WS": ws}) for ws in (0, 1)}
    plain, ws = got[0]["ptx"], got[1]["ptx"]
    assert plain["copy_wait_group"] > 0 and plain["copy_arrive"] == 0 and plain["setmaxnreg"] == 0
    assert ws["copy_wait_group"] == 0, ws
    assert ws["copy_arrive"] == 2 and ws["mbarrier.try_wait"] >= 3 and ws["setmaxnreg"] > 0, ws
    assert ws["wgmma"] > 0 and ws["mma.sync"] == 0 and ws["ld.global.v4"] == 0, ws
    widths = [k for k in ws if re.fullmatch(r"cp\.async\.\d+B", k)]
    assert ws["cp.async.16B"] > 0 and widths == ["cp.async.16B"], ws
    assert got[1]["usage"] == {"registers": 168, "stack": 0, "local": 0}, got[1]["usage"]


@pytest.mark.slow  # sm_90 builds through ptxas in a subprocess: 3-19 s each on a 2-core CPU
@needs_gluon
@pytest.mark.parametrize(
    "config",
    [
        {"S": 2, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 4},
        {"S": 4, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 8, "STORE_CVT": 1},
    ],
    ids=["t32-ring4-v4", "t32-ring4-v8"],
)  # no spill under Triton 3.6 and 3.9 (64-row tiles spill 16-400 bytes, see
# the note of _ws_compute_wg in kernels/sparse_decode_wgmma/gluon_kernels.py)
def test_sparse_decode_wgmma_split_wg_compiles_to_two_consumer_partitions_each_with_its_own_products(config):
    """SPLIT_WG=1's sm_90 build: beside the producer, two 4-warp consumer partitions, each its own copy of the
    products (twice WS's wgmma instructions, each 64 heads by a whole tile), each waiting on the ring's mbarriers and
    on the other's hand-over barrier (more waits than WS), nobody waiting on a copy group, and no spill."""
    shape = {"batch": 64, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    got = {wg: _sm90_build(shape, {**config, "WS": 1, "SPLIT_WG": wg}) for wg in (0, 1)}
    ws, split = got[0]["ptx"], got[1]["ptx"]
    assert split["wgmma"] == 2 * ws["wgmma"], (ws, split)
    assert split["setmaxnreg"] > ws["setmaxnreg"] and split["mbarrier.try_wait"] > ws["mbarrier.try_wait"], (ws, split)
    assert split["copy_wait_group"] == 0 and split["copy_arrive"] == 2 and split["mma.sync"] == 0, split
    assert got[1]["usage"] == {"registers": 168, "stack": 0, "local": 0}, got[1]["usage"]


@pytest.mark.slow  # sm_90 builds through ptxas in a subprocess: 3-19 s each on a 2-core CPU
@needs_gluon
@pytest.mark.parametrize(
    "config",
    [
        {"S": 5, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1, "STORE_CVT": 1},
        {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 1, "STORE_CVT": 1},
        {"S": 5, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "WS": 0, "STORE_CVT": 1},
        {"S": 5, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 8, "WS": 1, "STORE_CVT": 1},
        {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 1, "STORE_CVT": 1},
        {"S": 5, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 1, "STORE_CVT": 1},
        {"S": 5, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 4, "WS": 1, "SPLIT_WG": 1, "STORE_CVT": 0},
    ],
    ids=["ws-v2-cvt", "ws-v1-cvt", "plain-v2-cvt", "ws-v8-cvt", "split-wg-v2-cvt", "split-wg-t32-cvt", "split-wg-v4"],
)
def test_the_wgmma_shared_memory_rule_bounds_the_sm90_build(config):
    """check_config rejects a config by smem_bytes: it must not be under what the sm_90 build allocates (a config
    that passes and then cannot launch is a failed trial and a failed test), nor more than 4 KiB over, for configs
    that fit."""
    k = get_kernel("sparse_decode_wgmma")
    shape = {"batch": 64, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    config = {**DEFAULT_CONFIG, **config}  # the keys not given: off (the batch-64 default turns SPLIT_WG on)
    built = _sm90_build(shape, config)["shared_bytes"]
    assert built <= k.smem_bytes(config, shape) <= built + 4096, (built, k.smem_bytes(config, shape))


needs_hopper = pytest.mark.skipif(not (HOPPER and HAVE_GLUON), reason="needs an sm_90 GPU and Gluon")


def test_the_split_wg_producer_keeps_its_splits_row_numbers_in_shared_memory_where_they_fit():
    """index_tiles: with SPLIT_WG the table holds a power of two of tiles covering the split (the batch-64 default:
    20 tiles of 32 rows -> 32), counted by the shared-memory rule; none for the WS schedule (its consumers carry
    their masks a tile ahead) or the single-partition one, and none where the table would not fit beside q, the
    ring, P's tiles and the converted stores' staging (then the indices are loaded a tile ahead, as before)."""
    from kernels.sparse_decode_wgmma import SparseDecodeWgmmaKernel, default_config, index_tiles
    from kernels.sparse_decode_wgmma.rules import smem_bytes_without_table

    kernel = SparseDecodeWgmmaKernel.instance
    shape = {"batch": 64, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    b64 = default_config(64, 640)
    assert b64["SPLIT_WG"] == 1 and index_tiles(b64, shape) == 32
    assert kernel.smem_bytes(b64, shape) == smem_bytes_without_table(b64, shape) + 32 * 32 * 4
    assert index_tiles(default_config(16, 640), {**shape, "batch": 16}) == 0  # WS, not SPLIT_WG
    assert index_tiles({**b64, "SPLIT_WG": 0}, shape) == 0 and index_tiles({**b64, "WS": 0, "SPLIT_WG": 0}, shape) == 0
    long = {**shape, "topk": 4096}  # one split of 128 tiles: a 16 KiB table, over IDX_TABLE_MAX
    assert index_tiles(b64, long) == 0 and kernel.smem_bytes(b64, long) == smem_bytes_without_table(b64, long)
    assert index_tiles(b64, {**shape, "topk": 2048}) == 64  # 8 KiB: the most it takes


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "config",
    [
        {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1},
        {"S": 5, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1},
        {"S": 3, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1},
        {"S": 1, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 1},
        {"S": 8, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 1},
        {"S": 20, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 1},
        {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2},
        {"S": 3, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2},
        {"S": 20, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2},
        {"S": 4, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 2},
        {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2},
        {"S": 2, "BLOCK_T": 64, "STAGES": 2, "STORE_CVT": 1, "V_SPLIT": 1},
        {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "STORE_CVT": 1},
        {"S": 20, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 2, "STORE_CVT": 1},
        {"S": 20, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 4},
        {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 4, "STORE_CVT": 1},
        {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8},
        {"S": 20, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 8, "STORE_CVT": 1},
        {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 1},
        {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 1},
        {"S": 5, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1},
        {"S": 20, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 1, "WS": 1},
        {"S": 8, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 4, "STORE_CVT": 1, "WS": 1},
        {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "WS": 1},
        {"S": 1, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 8, "STORE_CVT": 1, "WS": 1},
        {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "WS": 0},
        {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1},
        {"S": 20, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 4, "STORE_CVT": 1},
        {"S": 3, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 0},
        {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "STORE_CVT": 1, "SPLIT_WG": 1},
        {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "SPLIT_WG": 1},
        {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "SPLIT_WG": 1},
        {"S": 2, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 4, "SPLIT_WG": 1},
        {"S": 4, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 2, "SPLIT_WG": 1},
        {"S": 3, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 4, "STORE_CVT": 1, "SPLIT_WG": 1},
    ],
    ids=str,
)
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_sparse_decode_wgmma_matches_the_reference_at_v4_flash_shapes(batch, config):
    """Ragged padding (requests after the first keep a random number of rows, some none), one to twenty tiles a
    split, ring depths 2-4, one program or two (V_SPLIT) a split, into NaN-poisoned outputs; a request with no row
    gets zeros."""
    shape = dict(SD.shapes("v4flash")[0], batch=batch, ragged=1)
    i = SD.make_inputs(shape, "bfloat16", "cuda", seed=batch * 7 + config["S"] + 100 * config.get("V_SPLIT", 1))
    if batch > 1:
        i["indices"][1] = -1  # a request with every row padding
    ref = SD.reference(i)
    out = torch.full((batch, 64, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    # a config without WS (SPLIT_WG) runs without it at every batch (the batch-64 default turns both on)
    got = sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"], {"WS": 0, "SPLIT_WG": 0, **config}, out=out)
    assert rel_error(got, ref) <= SD.tolerance("bfloat16")
    if batch > 1:
        assert torch.count_nonzero(got[1]) == 0


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "config",
    [
        {"S": 10, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 8, "WS": 1},
        {"S": 4, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 2, "WS": 1},
        {"S": 20, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 4, "WS": 1, "STORE_CVT": 1},
        {"S": 2, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 1, "WS": 1},
        {"S": 1, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 2, "SPLIT_WG": 1, "STORE_CVT": 1},
        {"S": 3, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 4, "SPLIT_WG": 1},
    ],
    ids=str,
)
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_sparse_decode_wgmma_with_an_fp8_cache_matches_the_reference_of_its_dequantised_rows(batch, config):
    """An fp8 e4m3 cache with a float32 scale per row (rows of different magnitudes, so a scale applied to the wrong
    row shows), ragged padding and a request with no row, every schedule with a producer (WS, SPLIT_WG with its
    index table), 1 to 20 splits, into NaN-poisoned outputs: within the fp8 tolerance of the float32 reference of
    the dequantised cache."""
    shape = dict(SD.shapes("v4flash")[0], batch=batch, ragged=1)
    i = SD.make_inputs(shape, "float8_e4m3fn", "cuda", seed=batch * 11 + config["S"] + 100 * config["V_SPLIT"])
    if batch > 1:
        i["indices"][1] = -1
    ref = SD.reference(i)
    out = torch.full((batch, 64, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = sparse_decode_wgmma(
        i["q"], i["kv"], i["indices"], i["sm_scale"], {"SPLIT_WG": 0, **config}, out=out, kv_scale=i["kv_scale"]
    )
    assert rel_error(got, ref) <= SD.tolerance("float8_e4m3fn")
    if batch > 1:
        assert torch.count_nonzero(got[1]) == 0
    if batch == 64:  # the launcher's own config (the default made fit for fp8) on the same inputs
        again = sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"], kv_scale=i["kv_scale"])
        assert rel_error(again, ref) <= SD.tolerance("float8_e4m3fn")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "config",
    [
        {"S": 1, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "STORE_CVT": 1},
        {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2},
    ],
    ids=str,
)
@pytest.mark.parametrize("batch", [5, 64])
def test_sparse_decode_wgmma_split_wg_without_its_index_table_matches_the_reference(batch, config):
    """SPLIT_WG's indices loaded a tile ahead from global memory, the path a split too long for its index table
    takes (2560 rows in one split: 10 KiB of row numbers, over ``IDX_TABLE_MAX``), ragged padding and a request of
    padding only, into NaN-poisoned outputs."""
    from kernels.sparse_decode_wgmma import index_tiles

    shape = dict(SD.shapes("v4flash")[0], batch=batch, topk=2560, ragged=1)
    cfg = {**config, "WS": 1, "SPLIT_WG": 1}
    assert index_tiles({**DEFAULT_CONFIG, **cfg}, shape) == 0
    i = SD.make_inputs(shape, "bfloat16", "cuda", seed=batch * 13 + config["S"])
    i["indices"][1] = -1
    out = torch.full((batch, 64, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"], cfg, out=out)
    assert rel_error(got, SD.reference(i)) <= SD.tolerance("bfloat16")
    assert torch.count_nonzero(got[1]) == 0


@pytest.mark.gpu
@needs_hopper
def test_sparse_decode_wgmma_fp16_and_fewer_heads_match_the_reference():
    """fp16 q and cache; 16 heads (the tile's other 48 rows masked); indices past the cache's end are padding."""
    for dtype, heads in ((torch.float16, 64), (torch.bfloat16, 16)):
        g = torch.Generator(device="cuda").manual_seed(heads)
        q = torch.randn(3, heads, 512, generator=g, device="cuda").to(dtype)
        kv = torch.randn(8192, 512, generator=g, device="cuda").to(dtype)
        idx = torch.randint(0, 8192 + 500, (3, 640), generator=g, device="cuda", dtype=torch.int32)
        ref = SD.reference({"q": q, "kv": kv, "indices": idx, "sm_scale": 0.05, "d_v": 512, "kv_scale": None})
        out = torch.full((3, heads, 512), float("nan"), device="cuda", dtype=dtype)
        # ws 2: SPLIT_WG (two programs a split at least)
        for v_split, ws in itertools.product((1, 2, 4, 8), (0, 1, 2)):
            if ws == 2 and v_split == 1:
                continue
            out.fill_(float("nan"))
            got = sparse_decode_wgmma(
                q,
                kv,
                idx,
                0.05,
                {
                    "S": 4,
                    "BLOCK_T": 32,
                    "STAGES": 2 if ws == 2 else 3,
                    "V_SPLIT": v_split,
                    "STORE_CVT": int(v_split > 1),
                    "WS": int(ws > 0),
                    "SPLIT_WG": int(ws == 2),
                },
                out=out,
            )
            assert rel_error(got, ref) <= SD.tolerance("bfloat16"), (dtype, heads, v_split, ws)


@pytest.mark.slow  # sm_90 builds through ptxas in a subprocess: 3-19 s each on a 2-core CPU
@needs_gluon
def test_sparse_decode_wgmma_store_cvt_writes_its_partials_in_16_byte_stores_on_sm90():
    """From the wgmma layout a thread holds 2 adjacent float32 values of a row: 8-byte stores, 4 threads a row.
    STORE_CVT converts the [64, 512] float32 partials first: 16-byte stores only, 128 KiB over 256 threads."""
    shape = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    ptx = _sm90_build(shape, {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "STORE_CVT": 1})["ptx"]
    assert ptx["st.global.v4"] == 32 and ptx["st.global.v2"] == 0, ptx


def test_the_one_wave_rules_count_the_gpus_own_sms(monkeypatch):
    """An H100 PCIe has 114 SMs, not the H200's 132: the split count set for another batch, and the fall-back to the
    default where one split of ``V_SPLIT`` programs a request is more than a wave, follow the GPU's SM count."""
    import kernels.sparse_decode_wgmma as w
    import kernels.sparse_decode_wgmma.launch as launch
    from kernels.base import device_limits
    from kernels.sparse_decode import split_rows

    assert w.one_wave() == (
        torch.cuda.get_device_properties(0).multi_processor_count
        if torch.cuda.is_available()
        else device_limits(None)["sms"]
    )
    # batch 24, two programs a split, 64-row tiles: 2 splits (96 programs) fit 114 and 132; batch 13: 5 fit 132 only
    assert w.splits_within(24, 640, 2, 64, sms=114) == 2
    assert split_rows(640, w.splits_within(13, 640, 2, 64, sms=132), 64)[1] == 5
    assert split_rows(640, w.splits_within(13, 640, 2, 64, sms=114), 64)[1] == 4
    kernel = w.SparseDecodeWgmmaKernel.instance
    tuned = {**w.default_config(16, 640), "V_SPLIT": 2, "S": 4}
    at16 = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640}
    at60 = {**at16, "batch": 60}
    monkeypatch.setattr(launch, "one_wave", lambda: 132)
    assert kernel.adapt_config(tuned, at16, at60) == {**tuned, "S": 1}  # 120 programs: one split fits
    monkeypatch.setattr(launch, "one_wave", lambda: 114)
    assert kernel.adapt_config(tuned, at16, at60) == kernel.default_config(at60)  # 120 > 114: the default


def test_the_wgmma_default_configs_program_budget_is_the_gpus_sms_in_whole_eight_program_splits():
    """default_config's budget of programs follows the GPU's SM count, not a fixed 128: 128 programs on a 132-SM
    H200 (batch 1: 10 tiles x 8 programs a split = 80 fit), 112 on a 114-SM H100 PCIe, 64 on a 64-SM part (batch
    1 then takes 4 programs a split: 40), and every default launches one wave at most."""
    from kernels.sparse_decode import split_rows
    from kernels.sparse_decode_wgmma import default_config, programs

    assert (programs(132), programs(114), programs(64)) == (128, 112, 64)
    assert default_config(1, 640, sms=132)["V_SPLIT"] == 8 and default_config(1, 640, sms=64)["V_SPLIT"] == 4
    assert default_config(13, 640, sms=132)["V_SPLIT"] == 2 and default_config(60, 640, sms=114)["V_SPLIT"] == 1
    for sms in (64, 114, 132):
        for batch in range(1, sms + 1):
            got = default_config(batch, 640, sms=sms)
            assert batch * got["V_SPLIT"] * split_rows(640, got["S"], got["BLOCK_T"])[1] <= sms, (sms, batch, got)


def test_the_wgmma_default_config_launches_one_wave_of_programs_at_every_batch_that_fits_one():
    """At every batch up to 132 (V4-Flash's 640 rows) the default launches at most 132 programs (one an SM of an
    H200): the rule before 2026-12-01 rounded its split count up and launched a second wave at 108 of these batches
    (144 programs at batch 24, 192 at 48)."""
    from kernels.sparse_decode import split_rows
    from kernels.sparse_decode_wgmma import default_config, one_wave

    waves = one_wave()  # 132 without a GPU, as on an H200
    for batch in range(1, waves + 1):
        got = default_config(batch, 640)
        programs = batch * got["V_SPLIT"] * split_rows(640, got["S"], got["BLOCK_T"])[1]
        assert programs <= waves, (batch, got, programs)
        assert got["S"] == split_rows(640, got["S"], got["BLOCK_T"])[1], (batch, got)  # S names its splits
    assert default_config(24, 640)["S"] == 2 and default_config(7, 640)["S"] == 5


def test_the_wgmma_default_config_is_the_measured_fastest_at_v4_flash_batches():
    """The default rule against the stored H200 sweeps (benchmarks/results/sparse_decode_wgmma/h200/*.json), the
    newest of each batch: it names a config whose split of the rows, tile size, ring depth, programs a split,
    schedule (WS, SPLIT_WG) and stores (STORE_CVT) are those of the fastest timed config with float32 partials (the
    default keeps them: see default_config). Sweeps before WS or SPLIT_WG have no such key (0)."""
    from kernels.sparse_decode import split_rows
    from kernels.sparse_decode_wgmma import default_config

    newest = {}
    for path in (ROOT / "benchmarks" / "results" / "sparse_decode_wgmma" / "h200").glob("*.json"):
        data = json.loads(path.read_text())
        for case in data["cases"]:
            if case["batch"] not in newest or data["meta"]["date"] > newest[case["batch"]][0]:
                newest[case["batch"]] = (data["meta"]["date"], case)
    assert set(newest) == {1, 16, 64}
    for _, case in newest.values():
        best = min(
            (r for r in case["rows"] if r["kernel"] == "wgmma" and "us" in r and not r["config"].get("PART16")),
            key=lambda r: r["us"],
        )["config"]
        got = default_config(case["batch"], 640)
        assert got["BLOCK_T"] == best["BLOCK_T"] and got["V_SPLIT"] == best.get("V_SPLIT", 1), (
            case["batch"],
            got,
            best,
        )
        assert (got["WS"], got["STORE_CVT"]) == (best.get("WS", 0), best.get("STORE_CVT", 0)), (
            case["batch"],
            got,
            best,
        )
        assert (got["SPLIT_WG"], got["STAGES"]) == (best.get("SPLIT_WG", 0), best["STAGES"]), (case["batch"], got, best)
        assert split_rows(640, got["S"], got["BLOCK_T"]) == split_rows(640, best["S"], best["BLOCK_T"]), (
            case["batch"],
            got,
            best,
        )


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "config",
    [
        {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "WS": 0},  # batch 1's default
        {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1},  # batch 16's
        {"S": 4, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "SPLIT_WG": 1},
    ],
    ids=["plain", "ws", "split_wg"],
)
@pytest.mark.parametrize("batch", [1, 16])
def test_sparse_decode_wgmma_chained_with_pdl_in_a_cuda_graph_matches_the_reference_at_every_step(batch, config):
    """Programmatic dependent launch (the merge started early where :func:`merge_starts_early` says so: batch 1)
    lets each merge kernel start before its split kernel ends: three calls chained
    in one CUDA graph, each call's q the previous call's output and its partials in the buffers the previous call
    freed, replayed into NaN-poisoned outputs; every step matches the float32 reference of its actual input (a merge
    that read its partials early, or a split that read q before the merge before it wrote it, would not)."""
    shape = dict(SD.shapes("v4flash")[0], batch=batch, ragged=1)
    i = SD.make_inputs(shape, "bfloat16", "cuda", seed=900 + batch)
    q0 = i["q"].clone()
    outs = [torch.empty(batch, 64, 512, device="cuda", dtype=torch.bfloat16) for _ in range(3)]

    def run(q, o):
        return sparse_decode_wgmma(q, i["kv"], i["indices"], i["sm_scale"], config, out=o, pdl=True)

    run(q0, outs[0])  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q = q0
        for o in outs:
            run(q, o)
            q = o * 8.0  # a kernel between the calls, as a decode step has (and keeps the scores' scale)
    for seed in range(3):
        q0.copy_(torch.randn_like(q0, generator=torch.Generator("cuda").manual_seed(seed)))
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for step, o in enumerate(outs):
            q_in = q0 if step == 0 else outs[step - 1] * 8.0
            ref = SD.reference({**i, "q": q_in})
            assert rel_error(o, ref) <= SD.tolerance("bfloat16"), (seed, step)
