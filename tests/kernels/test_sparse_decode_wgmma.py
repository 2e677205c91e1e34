"""The Gluon wgmma sparse-decode kernel (kernels/sparse_decode_wgmma.py).

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
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels" / "compile_probe.py"), "wgmma", json.dumps(shape),
                        json.dumps(config), json.dumps(kwargs or {})], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    return {**json.loads(lines[-1]), **({"ptxas_log": "\n".join(lines[:-1])} if ptxas_log else {})}


@needs_gluon
@pytest.mark.parametrize("change, fragment", [
    ({"heads": 128}, "heads=128 (at most 64)"),
    ({"d": 256}, "d_qk=256, d_v=256 (both 512)"),
    ({"dtype": torch.float32}, "dtype torch.float32 (bfloat16 or float16)"),
], ids=["heads", "width", "dtype"])
def test_sparse_decode_wgmma_rejects_shapes_it_cannot_run_with_one_line(change, fragment):
    with pytest.raises(ValueError) as err:
        sparse_decode_wgmma(*_inputs(1, **change))
    assert fragment in str(err.value) and "use kernels.sparse_decode.sparse_decode" in str(err.value)
    assert "\n" not in str(err.value)


@needs_gluon
def test_sparse_decode_wgmma_asks_an_fp8_cache_for_its_row_scales_and_refuses_timing_probes_on_it():
    q, kv, idx = _inputs(1)
    with pytest.raises(ValueError, match=r"an fp8 kv cache needs kv_scale: float32 \[4096\] \(one scale per row\), "
                                         r"got None"):
        sparse_decode_wgmma(q, kv.to(torch.float8_e4m3fn), idx)
    scale = torch.ones(4096)
    with pytest.raises(ValueError, match=r"_probe='no_copies' is not built for an fp8 cache; use one of "
                                         r"\['no_products', 'fp8_no_widen', 'fp8_no_copies'\]"):
        sparse_decode_wgmma(q.to("meta"), kv.to(torch.float8_e4m3fn).to("meta"), idx.to("meta"),
                            config={"WS": 1, "BLOCK_T": 32}, kv_scale=scale.to("meta"), _probe="no_copies")


FP8 = "float8_e4m3fn"
V4 = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}


@needs_gluon
@pytest.mark.parametrize("config, rule", [
    ({"S": 4, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 2, "WS": 0},
     r"fp8_cache: an fp8 cache needs the producer warpgroup that widens its rows \(WS=1, SPLIT_WG=1 or SEESAW=1\); "
     r"got WS=0"),
    ({"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1},
     r"shared_memory: an fp8 cache needs two staging slots of 32 KiB beside 196 KiB \(at most 227 KiB\); lower "
     r"STAGES or BLOCK_T"),
], ids=["no-producer", "no-room"])
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
    cases += [(dict(V4, batch=int(key.split("batch=")[1].split(",")[0])), {**DEFAULT_CONFIG, **e["config"]})
              for key, e in tuned.items()]
    for shape, config in cases:
        assert k.fit_dtype(config, shape, "bfloat16") is config
        fit = k.fit_dtype(config, shape, FP8)
        assert k.check_config(fit, shape, None, FP8) is None, (shape["batch"], config, fit)
        assert fp8_stages(fit, shape) >= 2
        assert fit["WS"] == 1 and fit["S"] == config["S"] and fit["V_SPLIT"] == config["V_SPLIT"]
        assert fit["BLOCK_T"] == (config["BLOCK_T"] if fp8_stages({**config, "WS": 1, "STAGES": 2}, shape) >= 2
                                  else 32)
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


@needs_gluon
@pytest.mark.parametrize("config", [
    {"S": 10, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 8, "WS": 1},
    {"S": 1, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 1, "STORE_CVT": 1},
    {"S": 4, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 1, "SEESAW": 1},
], ids=["ws-v8", "split-wg-table", "seesaw"])
def test_an_fp8_cache_compiles_to_staged_row_and_scale_copies_widened_by_the_producer_without_spills(config):
    """The fp8 build for sm_90: the producer copies 16 bytes of fp8 a thread and each row's 4-byte scale by cp.async
    into its staging ring and waits on its own copy groups (the 16-bit ring's copies arrive on mbarriers instead; q
    too, which is widened in place here), widens the rows with one cvt for two values (e4m3 to float16, no float32
    round trip); the consumers still run wgmma; no local memory; the shared memory rule (the 16-bit schedule's
    bytes plus the staging slots and the ring's row scales) bounds the build."""
    from kernels.sparse_decode_wgmma import SM90_SMEM, fp8_stages

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
    staging = (fp8_stages(config, shape) * config["BLOCK_T"] * (512 + 4)  # the staging ring, its scales
               + config["STAGES"] * config["BLOCK_T"] * 4)  # and the 16-bit ring's row scales
    assert fp8["shared_bytes"] <= k.smem_bytes(config, shape) + staging <= fp8["shared_bytes"] + 4096
    assert fp8["shared_bytes"] <= SM90_SMEM


@needs_gluon
@pytest.mark.parametrize("config, rule", [
    ({"BLOCK_T": 16}, r"block_t: BLOCK_T=16 must be one of \(32, 64\)"), ({"STAGES": 1}, r"stages: STAGES=1"),
    ({"S": 0}, "positive_int: S=0"), ({"P_SMEM": 2}, "switch: P_SMEM=2 must be 0 or 1"),
    ({"V_SPLIT": 3}, r"v_split: V_SPLIT=3 must be one of \(1, 2, 4, 8\)"), ({"PART16": 2}, "switch: PART16=2"),
    ({"STORE_CVT": 2}, "switch: STORE_CVT=2"), ({"num_warps": 4}, r"unknown_param: \['num_warps'\]"),
    ({"STAGES": 3, "BLOCK_T": 64}, "shared_memory: 260 KiB > 227 KiB"),
    ({"S": 5, "BLOCK_T": 64, "V_SPLIT": 1, "P_SMEM": 1, "WS": 1, "STORE_CVT": 1}, "shared_memory: 232 KiB > 227 KiB"),
    ({"SPLIT_WG": 1, "V_SPLIT": 1}, r"split_wg: SPLIT_WG=1 needs V_SPLIT >= 2 .*got V_SPLIT=1, STAGES=2"),
    ({"SPLIT_WG": 1, "V_SPLIT": 2, "STAGES": 3, "BLOCK_T": 32}, r"split_wg: .*an even ring .*got V_SPLIT=2, STAGES=3"),
    ({"SPLIT_WG": 2}, "switch: SPLIT_WG=2 must be 0 or 1"),
    ({"SEESAW": 1, "V_SPLIT": 2}, r"seesaw: SEESAW=1 needs V_SPLIT=1 .*got V_SPLIT=2, SPLIT_WG=0, MERGE=0, STORE_CVT=0"),
    ({"SEESAW": 1, "V_SPLIT": 1, "MERGE": 1}, r"seesaw: .*got V_SPLIT=1, SPLIT_WG=0, MERGE=1, STORE_CVT=0"),
    ({"SEESAW": 1, "V_SPLIT": 1, "STORE_CVT": 1}, r"seesaw: .*got V_SPLIT=1, SPLIT_WG=0, MERGE=0, STORE_CVT=1"),
    ({"SEESAW": 1, "V_SPLIT": 2, "SPLIT_WG": 1}, r"seesaw: .*got V_SPLIT=2, SPLIT_WG=1"),
], ids=str)
def test_sparse_decode_wgmma_rejects_a_config_outside_its_space_in_one_line_naming_the_rule(config, rule):
    from kernels.base import InvalidConfig

    with pytest.raises(InvalidConfig, match=r"sparse_decode_wgmma: config .* cannot run for shape .*: " + rule) as err:
        sparse_decode_wgmma(*_inputs(1), config=config)
    assert "\n" not in str(err.value)


@needs_gluon
@pytest.mark.parametrize("config, probe, message", [
    ({"WS": 0, "SPLIT_WG": 0}, "no_copies", r"_probe='no_copies': one of .*, with WS=1, SPLIT_WG=1 or SEESAW=1"),
    ({"WS": 1}, "bogus", r"_probe='bogus': one of \['indices_ahead', 'no_copies', 'no_products', 'timeline'\]"),
    ({"S": 2, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 1, "SPLIT_WG": 0, "STORE_CVT": 0, "SEESAW": 1}, "no_products",
     r"_probe='no_products' is not built for SEESAW=1 .*use no_copies or indices_ahead"),
    ({"S": 4, "WS": 1}, "timeline", r"_probe='timeline' needs _stamps, an int64 tensor on cpu of at least 512 x 16 "),
    ({"S": 4, "WS": 1, "MERGE": 1}, "timeline", r"_probe='timeline' is not built for MERGE=1 or SEESAW=1"),
    ({"S": 2, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 1, "SPLIT_WG": 0, "STORE_CVT": 0, "SEESAW": 1}, "timeline",
     r"_probe='timeline' is not built for MERGE=1 or SEESAW=1"),
], ids=["plain", "unknown", "seesaw-no-products", "timeline-without-stamps", "timeline-merge", "timeline-seesaw"])
def test_sparse_decode_wgmma_refuses_a_timing_probe_its_config_has_not_in_one_line(config, probe, message):
    """The timing probes exist only in the warp-specialised builds, ``no_products`` not in SEESAW's (its consumers
    wait on each other's softmax), and ``timeline`` neither there nor with MERGE (whose counters its stamps'
    buffer replaces), and only with a buffer of a row a program: asking otherwise is a one-line error before
    anything runs."""
    with pytest.raises(ValueError, match=r"sparse_decode_wgmma: " + message) as err:
        sparse_decode_wgmma(*_inputs(64), config=config, _probe=probe)
    assert "\n" not in str(err.value)
    if probe == "timeline" and "needs" in message:  # a buffer of the wrong dtype or too small: the same line
        for bad in (torch.zeros(512, 16, dtype=torch.int32), torch.zeros(511, 16, dtype=torch.int64)):
            with pytest.raises(ValueError, match="needs _stamps"):
                sparse_decode_wgmma(*_inputs(64), config=config, _probe=probe, _stamps=bad)


def test_the_wgmma_kernel_is_registered_tunable_and_says_why_it_cannot_run_here():
    """The kernel search and tuned-config files see it as ``sparse_decode_wgmma``: its default passes its rules at
    every V4-Flash batch, configs that launch the same program share one canonical form, and on a machine without
    an sm_90 GPU (or without Gluon) it names the reason instead of running."""
    from kernels.registry import get_kernel

    k = get_kernel("sparse_decode_wgmma")
    for shape in k.shapes("v4flash") + k.shapes("test"):
        assert k.check_config(k.default_config(shape), shape) is None
    b16 = k.shapes("v4flash")[1]
    base = {"BLOCK_T": 64, "STAGES": 2, "P_SMEM": 0, "V_SPLIT": 1, "PART16": 1, "STORE_CVT": 0, "WS": 0, "MERGE": 1,
            "SPLIT_WG": 0, "SEESAW": 0}
    assert k.canonical_config({**base, "S": 16}, b16) == {**base, "S": 10}  # ten 64-row splits either way
    assert k.canonical_config({**base, "S": 1}, b16)["PART16"] == 0  # one split: no partials
    assert k.canonical_config({**base, "S": 1}, b16)["MERGE"] == 0  # ... and nothing to merge
    assert k.canonical_config({**base, "S": 4}, b16) == {**base, "S": 4}
    assert k.canonical_config({**base, "S": 4, "V_SPLIT": 2, "SPLIT_WG": 1}, b16)["WS"] == 1  # warp-specialised anyway
    seesaw = k.canonical_config({**base, "S": 4, "SEESAW": 1, "P_SMEM": 1}, b16)  # its P always through shared memory
    assert (seesaw["WS"], seesaw["P_SMEM"]) == (1, 0)
    assert k.check_config({**base, "S": 4, "heads": 1}, b16).startswith("unknown_param")
    assert k.check_config({**base, "S": 4}, {**b16, "heads": 128}).startswith("heads: 128 > 64")
    if not (HOPPER and HAVE_GLUON):
        assert k.unavailable() and ("sm_90" in k.unavailable() or "9.0" in k.unavailable() or "Gluon" in k.unavailable())
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


@needs_gluon
@pytest.mark.parametrize("config", [
    {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "WS": 0},  # batch 1's default: the single-partition kernel
    {"S": 4, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 1},  # warp-specialised
], ids=["plain", "split_wg"])
def test_sparse_decode_wgmma_split_kernel_starts_its_pdl_merge_early_only_when_the_merge_waits_for_it(config):
    """With ``pdl`` the merge kernel is launched with programmatic dependent launch (it waits in-kernel for the split
    kernel's stores) and, at batch 1 (few programs, a small merge: ``merge_starts_early``), the split kernel lets it
    start at once (one ``griddepcontrol.launch_dependents`` in its sm_90 PTX). Without ``pdl``, with
    ``_pdl_trigger=False`` (the launch before 2026-12-01), at batch 16 by the rule (unless ``_pdl_trigger=True``), or
    with one split (no merge kernel follows), the split kernel has none."""
    b1 = {"batch": 1, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    b16 = {**b1, "batch": 16}
    cases = [(b1, {"pdl": True}, config, 1, True), (b1, {"pdl": False}, config, 0, False),
             (b1, {"pdl": True, "_pdl_trigger": False}, config, 0, True), (b16, {"pdl": True}, config, 0, True),
             (b16, {"pdl": True, "_pdl_trigger": True}, config, 1, True)]
    if not config.get("SPLIT_WG"):
        cases.append((b1, {"pdl": True}, {**config, "S": 1, "V_SPLIT": 2}, 0, None))  # one split: the output directly
    for shape, kwargs, cfg, triggers, merge_pdl in cases:
        got = _sm90_build(shape, cfg, kwargs=kwargs)
        where = (shape["batch"], kwargs, cfg)
        assert got["ptx"]["griddepcontrol.launch_dependents"] == triggers, (where, got["ptx"])
        assert got["merge_launch_pdl"] is merge_pdl, (where, got["merge_launch_pdl"])


@needs_gluon
def test_sparse_decode_wgmma_compiles_for_sm90_to_wgmma_and_cp_async_without_spills():
    """The schedule the module states, in its sm_90 PTX: wgmma for both products, the gathers as 16-byte cp.async
    (each BLOCK_T x 512 bf16 tile: BLOCK_T * 64 copies over 256 threads), and no local memory (no spill). With
    V_SPLIT=2 the copies are rotated by the program's first column of V, and must stay 16 bytes wide."""
    for config in ({"S": 5, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 0}, {"S": 1, "BLOCK_T": 32, "STAGES": 4, "WS": 0},
                   {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 0}):  # the single-partition kernel
        shape = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
        got = _sm90_build(shape, config)
        ptx = got["ptx"]
        assert ptx["wgmma"] > 0 and ptx["mma.sync"] == 0, ptx
        assert ptx["cp.async.16B"] > 0 and ptx["ld.global.v4"] == 0, ptx  # q too arrives by cp.async
        assert not [k for k in ptx if k.startswith("cp.async.") and k != "cp.async.16B"], ptx  # no narrower copy
        assert got["usage"] is not None, "cuobjdump did not report the cubin's resource usage"
        assert got["usage"]["local"] == 0 and got["usage"]["stack"] == 0, got["usage"]  # no spill


@needs_gluon
@pytest.mark.parametrize("config", [
    {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8},
    {"S": 20, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 4, "PART16": 1, "STORE_CVT": 1},
    {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "P_SMEM": 1},
], ids=["v8", "v4-ring4-part16", "v2-psmem"])
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


@needs_gluon
@pytest.mark.parametrize("ws", [0, 1])
def test_sparse_decode_wgmma_merge_builds_one_release_acquire_counter_and_l2_reads_of_the_partials(ws):
    """MERGE=1's sm_90 build: one acq_rel atomic add a program (the arrival count that releases its partial and
    acquires the others'), the merge's reads of other SMs' partials past L1 (ld.global.cg), no spill; MERGE=0 has
    neither."""
    shape = {"batch": 1, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    got = {merge: _sm90_build(shape, {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "WS": ws, "MERGE": merge})
           for merge in (0, 1)}
    assert got[0]["ptx"]["atom.acq_rel.add"] == 0 and got[0]["ptx"]["ld.global.cg"] == 0, got[0]["ptx"]
    assert got[1]["ptx"]["atom.acq_rel.add"] == 1 and got[1]["ptx"]["ld.global.cg"] > 0, got[1]["ptx"]
    assert got[1]["usage"]["local"] == 0 and got[1]["usage"]["stack"] == 0, got[1]["usage"]


@needs_gluon
@pytest.mark.parametrize("config", [
    {"S": 2, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 4},
    {"S": 4, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 8, "STORE_CVT": 1},
], ids=["t32-ring4-v4", "t32-ring4-v8"])  # no spill under Triton 3.6 and 3.9 (64-row tiles spill 16-400 bytes, see
# the note in kernels/sparse_decode_wgmma.py)
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


@needs_gluon
@pytest.mark.parametrize("config", [
    {"S": 1, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 1, "STORE_CVT": 1},
    {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1},
], ids=["split-wg", "ws"])
def test_the_timeline_probe_reads_the_clocks_only_in_its_own_build(config):
    """``_probe="timeline"``: the same schedule (as many wgmma and copies) with the SM's cycle counter read at each
    phase (start, the producer's three, each consumer's four: 8 with WS's one consumer partition, 12 with SPLIT_WG's
    two) and the GPU's timer at the start and the end; the plain build reads neither."""
    shape = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    plain = _sm90_build(shape, config)["ptx"]
    probe = _sm90_build(shape, config, kwargs={"_probe": "timeline", "stamps": True})["ptx"]
    assert plain["%clock64"] == 0 and plain["%globaltimer"] == 0, plain
    assert probe["%clock64"] == (12 if config.get("SPLIT_WG") else 8) and probe["%globaltimer"] == 2, probe
    assert probe["wgmma"] == plain["wgmma"] and probe["cp.async.16B"] == plain["cp.async.16B"], (plain, probe)


@needs_gluon
def test_sparse_decode_wgmma_seesaw_compiles_to_two_consumers_that_each_own_the_scores_of_half_the_tiles():
    """SEESAW=1's sm_90 build at 32-row tiles: beside the producer, two 4-warp consumer partitions, each with one
    scores' product a tile it owns (64 x 32 x 512: 32 wgmma of K 16) and three O += P V sites for its 256 columns
    (its own tile from registers, the other's tile in the loop and after it: 2 wgmma of K 16 each), so 76 wgmma in
    all, where SPLIT_WG at the same tiles has 68 (a scores' product and one PV site a consumer); both wait on the
    other's published softmax (more mbarrier waits than SPLIT_WG), nobody waits on a copy group, ptxas keeps the
    products asynchronous, and no local memory."""
    shape = {"batch": 64, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    ring = {"S": 2, "BLOCK_T": 32, "STAGES": 4, "WS": 1, "STORE_CVT": 0}
    seesaw = _sm90_build(shape, {**ring, "V_SPLIT": 1, "SEESAW": 1, "SPLIT_WG": 0}, ptxas_log=True)
    split = _sm90_build(shape, {**ring, "V_SPLIT": 2, "SPLIT_WG": 1}, ptxas_log=True)
    # ptxas did not serialise the wgmma (C7512, "insufficient register resources": every product waited for, the
    # first SEESAW build's fate, which ran 0.79x the SPLIT_WG default on the H200 at 7619863)
    assert "Compiling entry function '_sparse_decode_wgmma_ws_kernel'" in seesaw["ptxas_log"], seesaw["ptxas_log"]
    assert "C7512" not in seesaw["ptxas_log"] and "C7512" not in split["ptxas_log"], seesaw["ptxas_log"]
    assert seesaw["ptx"]["wgmma"] == 2 * (32 + 3 * 2) and split["ptx"]["wgmma"] == 2 * (32 + 2), (seesaw, split)
    assert seesaw["ptx"]["mbarrier.try_wait"] > split["ptx"]["mbarrier.try_wait"], (seesaw, split)
    assert seesaw["ptx"]["copy_wait_group"] == 0 and seesaw["ptx"]["copy_arrive"] == 2, seesaw
    # a small stack frame (16 bytes under Triton 3.9, 40 under 3.6, the GPU image; measured 2026-12-01), no local
    # memory
    assert seesaw["usage"]["registers"] == 168 and seesaw["usage"]["local"] == 0, seesaw["usage"]
    assert seesaw["usage"]["stack"] <= 40, seesaw["usage"]


@needs_gluon
@pytest.mark.parametrize("config", [
    {"S": 5, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "P_SMEM": 1, "WS": 1, "STORE_CVT": 1},
    {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 1, "STORE_CVT": 1},
    {"S": 5, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "P_SMEM": 1, "WS": 0, "STORE_CVT": 1},
    {"S": 5, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 8, "WS": 1, "STORE_CVT": 1},
    {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 1, "STORE_CVT": 1},
    {"S": 5, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "P_SMEM": 1, "WS": 1, "SPLIT_WG": 1, "STORE_CVT": 1},
    {"S": 5, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 4, "WS": 1, "SPLIT_WG": 1, "STORE_CVT": 0},
    {"S": 2, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 1, "WS": 1, "SEESAW": 1},
    {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 1, "SEESAW": 1, "PART16": 1},
], ids=["ws-v2-psmem-cvt", "ws-v1-cvt", "plain-v2-psmem", "ws-v8-cvt", "split-wg-v2-cvt", "split-wg-t32-psmem-cvt",
        "split-wg-v4", "seesaw-t32-ring4", "seesaw-t64-part16"])
def test_the_wgmma_shared_memory_rule_bounds_the_sm90_build(config):
    """check_config rejects a config by smem_bytes: it must not be under what the sm_90 build allocates (a config
    that passes and then cannot launch is a failed trial and a failed test: WS with converted stores and P in shared
    memory at one program a split needed 237612 bytes and was let through at 200 KiB; it is now rejected, see the
    rejection test), nor more than 4 KiB over, for configs that fit."""
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

    kernel = SparseDecodeWgmmaKernel.instance
    shape = {"batch": 64, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    b64 = default_config(64, 640)
    assert b64["SPLIT_WG"] == 1 and index_tiles(b64, shape) == 32
    assert kernel.smem_bytes(b64, shape) == kernel.smem_bytes_without_table(b64, shape) + 32 * 32 * 4
    assert index_tiles(default_config(16, 640), {**shape, "batch": 16}) == 0  # WS, not SPLIT_WG
    assert index_tiles({**b64, "SPLIT_WG": 0}, shape) == 0 and index_tiles({**b64, "WS": 0, "SPLIT_WG": 0}, shape) == 0
    long = {**shape, "topk": 4096}  # one split of 128 tiles: a 16 KiB table, over IDX_TABLE_MAX
    assert index_tiles(b64, long) == 0 and kernel.smem_bytes(b64, long) == kernel.smem_bytes_without_table(b64, long)
    assert index_tiles(b64, {**shape, "topk": 2048}) == 64  # 8 KiB: the most it takes


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("config", [
    {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1}, {"S": 5, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1}, {"S": 3, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1},
    {"S": 1, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 1}, {"S": 8, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 1}, {"S": 20, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 1},
    {"S": 5, "BLOCK_T": 64, "STAGES": 2, "P_SMEM": 1, "V_SPLIT": 1}, {"S": 8, "BLOCK_T": 32, "STAGES": 3, "P_SMEM": 1, "V_SPLIT": 1},
    {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2}, {"S": 3, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2},
    {"S": 20, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "P_SMEM": 1}, {"S": 4, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 2},
    {"S": 5, "BLOCK_T": 64, "STAGES": 2, "PART16": 1, "V_SPLIT": 1}, {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "PART16": 1},
    {"S": 2, "BLOCK_T": 64, "STAGES": 2, "STORE_CVT": 1, "V_SPLIT": 1}, {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "STORE_CVT": 1},
    {"S": 20, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 2, "PART16": 1, "STORE_CVT": 1},
    {"S": 20, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 4}, {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 4, "PART16": 1, "STORE_CVT": 1},
    {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "P_SMEM": 1}, {"S": 20, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 8, "PART16": 1, "STORE_CVT": 1},
    {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 1}, {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 1},
    {"S": 5, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "P_SMEM": 1, "WS": 1}, {"S": 20, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 1, "WS": 1},
    {"S": 8, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 4, "PART16": 1, "STORE_CVT": 1, "WS": 1},
    {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "WS": 1}, {"S": 1, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 8, "STORE_CVT": 1, "WS": 1},
    {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "WS": 0, "MERGE": 1}, {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1, "MERGE": 1},
    {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 1, "MERGE": 1}, {"S": 20, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 4, "PART16": 1, "STORE_CVT": 1, "MERGE": 1},
    {"S": 3, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "WS": 0, "MERGE": 1, "P_SMEM": 1},
    {"S": 1, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "STORE_CVT": 1, "SPLIT_WG": 1},
    {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "SPLIT_WG": 1}, {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "SPLIT_WG": 1},
    {"S": 2, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 4, "P_SMEM": 1, "SPLIT_WG": 1},
    {"S": 4, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 2, "MERGE": 1, "SPLIT_WG": 1},
    {"S": 3, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 4, "PART16": 1, "STORE_CVT": 1, "SPLIT_WG": 1},
], ids=str)
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
@pytest.mark.parametrize("config", [
    {"S": 10, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 8, "WS": 1},
    {"S": 4, "BLOCK_T": 32, "STAGES": 3, "V_SPLIT": 2, "WS": 1},
    {"S": 20, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 4, "WS": 1, "PART16": 1, "STORE_CVT": 1},
    {"S": 2, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 1, "WS": 1, "MERGE": 1},
    {"S": 1, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 2, "SPLIT_WG": 1, "STORE_CVT": 1},
    {"S": 3, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 4, "SPLIT_WG": 1},
    {"S": 4, "BLOCK_T": 32, "STAGES": 2, "V_SPLIT": 1, "SEESAW": 1, "STORE_CVT": 0},
], ids=str)
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_sparse_decode_wgmma_with_an_fp8_cache_matches_the_reference_of_its_dequantised_rows(batch, config):
    """An fp8 e4m3 cache with a float32 scale per row (rows of different magnitudes, so a scale applied to the wrong
    row shows), ragged padding and a request with no row, every schedule with a producer (WS, SPLIT_WG with its
    index table, SEESAW), 1 to 20 splits, merged by the kernel or by the last program (MERGE), into NaN-poisoned
    outputs: within the fp8 tolerance of the float32 reference of the dequantised cache."""
    shape = dict(SD.shapes("v4flash")[0], batch=batch, ragged=1)
    i = SD.make_inputs(shape, "float8_e4m3fn", "cuda", seed=batch * 11 + config["S"] + 100 * config["V_SPLIT"])
    if batch > 1:
        i["indices"][1] = -1
    ref = SD.reference(i)
    out = torch.full((batch, 64, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"], {"SPLIT_WG": 0, "SEESAW": 0, **config},
                              out=out, kv_scale=i["kv_scale"])
    assert rel_error(got, ref) <= SD.tolerance("float8_e4m3fn")
    if batch > 1:
        assert torch.count_nonzero(got[1]) == 0
    if batch == 64:  # the launcher's own config (the default made fit for fp8) on the same inputs
        again = sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"], kv_scale=i["kv_scale"])
        assert rel_error(again, ref) <= SD.tolerance("float8_e4m3fn")


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("config", [
    {"S": 1, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 1, "STORE_CVT": 1},
    {"S": 4, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "WS": 1, "SPLIT_WG": 1},
    {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1},
], ids=str)
@pytest.mark.parametrize("batch", [5, 64])
def test_the_timeline_probe_gives_the_result_and_each_programs_stamps_in_order(batch, config):
    """``_probe="timeline"`` into a NaN-poisoned output matches the reference, and each program's row of stamps is
    what ``TIMELINE_STAMPS`` says: every stamp of its schedule reached, the SM's number one of the GPU's, each
    partition's clock stamps in order after the start (the producer's q before its index table; each consumer's q,
    first tile, last products, result or hand-over), the timer's end after its start; rows past the grid untouched."""
    from kernels.base import device_limits
    from kernels.sparse_decode import split_rows
    from kernels.sparse_decode_wgmma import STAMPS

    shape = dict(SD.shapes("v4flash")[0], batch=batch, ragged=1)
    i = SD.make_inputs(shape, "bfloat16", "cuda", seed=batch * 23 + config["S"])
    stamps = torch.zeros(batch * 64 + 1, STAMPS, dtype=torch.int64, device="cuda")
    out = torch.full((batch, 64, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"], {**DEFAULT_CONFIG, **config}, out=out,
                              _probe="timeline", _stamps=stamps)
    ref = SD.reference(i)
    assert rel_error(got, ref) <= SD.tolerance("bfloat16")
    programs = split_rows(640, config["S"], config["BLOCK_T"])[1] * config["V_SPLIT"] * batch
    rows = stamps.cpu().tolist()
    assert all(v == 0 for row in rows[programs:] for v in row)
    chains = [(1, 2, 3), (1, 5, 6, 7, 8)] + ([(1, 9, 10, 11, 12)] if config.get("SPLIT_WG") else [])
    for row in rows[:programs]:
        assert 0 <= row[14] < device_limits("cuda")["sms"] and row[13] > row[0] > 0, row
        for chain in chains:
            assert all(row[a] <= row[b] for a, b in zip(chain, chain[1:])) and row[chain[-1]] > row[1], (chain, row)
        assert row[4] >= row[3], row


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("config", [
    {"S": 1, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "STORE_CVT": 1}, {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2},
], ids=str)
@pytest.mark.parametrize("batch", [5, 64])
def test_sparse_decode_wgmma_split_wg_without_its_index_table_matches_the_reference(batch, config):
    """SPLIT_WG's indices loaded a tile ahead from global memory (the path a split too long for its table takes,
    forced here by ``_probe="indices_ahead"``), ragged padding and a request of padding only, into NaN-poisoned
    outputs."""
    shape = dict(SD.shapes("v4flash")[0], batch=batch, ragged=1)
    i = SD.make_inputs(shape, "bfloat16", "cuda", seed=batch * 13 + config["S"])
    i["indices"][1] = -1
    out = torch.full((batch, 64, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"], {**config, "WS": 1, "SPLIT_WG": 1},
                              out=out, _probe="indices_ahead")
    assert rel_error(got, SD.reference(i)) <= SD.tolerance("bfloat16")
    assert torch.count_nonzero(got[1]) == 0


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("config", [
    {"S": 1, "BLOCK_T": 32, "STAGES": 4}, {"S": 2, "BLOCK_T": 32, "STAGES": 4}, {"S": 2, "BLOCK_T": 32, "STAGES": 2},
    {"S": 8, "BLOCK_T": 32, "STAGES": 3}, {"S": 20, "BLOCK_T": 32, "STAGES": 4}, {"S": 3, "BLOCK_T": 64, "STAGES": 2},
    {"S": 10, "BLOCK_T": 64, "STAGES": 2}, {"S": 5, "BLOCK_T": 64, "STAGES": 2, "PART16": 1},
    {"S": 4, "BLOCK_T": 32, "STAGES": 4, "probe": "indices_ahead"},
], ids=str)
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_sparse_decode_wgmma_seesaw_matches_the_reference(batch, config):
    """SEESAW=1 (each consumer owns alternate tiles' softmax, both add every tile's P V for their half of the
    columns): splits of one tile (the second consumer owns none), of an odd and an even number of tiles, rings of
    2-4, 16-bit partials, its indices loaded a tile ahead instead of its index table; ragged padding and a request
    of padding only, into NaN-poisoned outputs."""
    config = dict(config)
    probe = config.pop("probe", "")
    shape = dict(SD.shapes("v4flash")[0], batch=batch, ragged=1)
    i = SD.make_inputs(shape, "bfloat16", "cuda", seed=batch * 17 + config["S"] + config["STAGES"])
    if batch > 1:
        i["indices"][1] = -1
    out = torch.full((batch, 64, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"],
                              {**config, "V_SPLIT": 1, "WS": 1, "SPLIT_WG": 0, "SEESAW": 1, "STORE_CVT": 0, "MERGE": 0},
                              out=out, _probe=probe)
    assert rel_error(got, SD.reference(i)) <= SD.tolerance("bfloat16")
    if batch > 1:
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
        # ws 2: SPLIT_WG (two columns of V at least); 3: SEESAW (all 512 columns)
        for v_split, ws in itertools.product((1, 2, 4, 8), (0, 1, 2, 3)):
            if (ws == 2 and v_split == 1) or (ws == 3 and v_split > 1):
                continue
            out.fill_(float("nan"))
            got = sparse_decode_wgmma(q, kv, idx, 0.05, {"S": 4, "BLOCK_T": 32, "STAGES": 2 if ws == 2 else 3,
                                                         "V_SPLIT": v_split, "STORE_CVT": int(v_split > 1),
                                                         "WS": int(ws > 0), "SPLIT_WG": int(ws == 2),
                                                         "SEESAW": int(ws == 3)}, out=out)
            assert rel_error(got, ref) <= SD.tolerance("bfloat16"), (dtype, heads, v_split, ws)


@needs_gluon
@pytest.mark.parametrize("part16, v4", [(0, 32), (1, 16)], ids=["float32", "bf16"])
def test_sparse_decode_wgmma_store_cvt_writes_its_partials_in_16_byte_stores_on_sm90(part16, v4):
    """From the wgmma layout a thread holds 2 adjacent values of a row: 8-byte (float32) or 4-byte (16-bit) stores,
    4 threads a row (16-bit partials then write half sectors: 0.59-0.96x the float32 ones on the H200 at db89c65,
    benchmarks/results/sparse_decode_wgmma/h200/2026-12-01_db89c65.json). STORE_CVT
    converts the [64, 512] partials first: 16-byte stores only, 64 KiB (or 128 KiB) over 256 threads."""
    shape = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    ptx = _sm90_build(shape, {"S": 2, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 1, "PART16": part16, "STORE_CVT": 1})["ptx"]
    assert ptx["st.global.v4"] == v4 and ptx["st.global.v2"] == 0, ptx


def test_the_wgmma_benchmark_times_every_partition_at_both_tile_sizes():
    """S=2 splits 640 rows into 320-row halves at BLOCK_T 32 and at 64: both are timed (they were deduplicated as one,
    so 64-row tiles were never timed at S = 1, 2, 5, 10), and S = 16 repeats S = 10's partition at 64-row tiles."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma import wgmma_configs

    configs = wgmma_configs()
    at = {(c["S"], c["BLOCK_T"]) for c in configs if c["STAGES"] == 2 and c["P_SMEM"] == 0}
    assert {(1, 64), (2, 64), (5, 64), (10, 64), (1, 32), (2, 32), (20, 32)} <= at
    assert (16, 64) not in at and (8, 64) not in at
    assert all(64 * 1024 + c["STAGES"] * c["BLOCK_T"] * 1024 + c["P_SMEM"] * 64 * c["BLOCK_T"] * 2 <= 227 * 1024 for c in configs)


def test_the_wgmma_benchmark_times_the_shipped_tl_dot_config_and_the_previous_runs_fastest_of_each_variant():
    """The tl.dot side of the side-by-side (CPU: the stored previous run): the shipped config first, then up to TOP
    fastest configs of the plain loop and TOP of idx_ahead from sparse_decode_ahead_h200.json, none twice. (A
    refactor once dropped TOP; only a linter caught it.)"""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma import PREVIOUS, TOP, tldot_configs

    shipped = {"S": 4, "BLOCK_H": 16, "BLOCK_T": 64, "num_warps": 4, "num_stages": 2}
    got = tldot_configs(16, shipped)
    assert got[0] == (shipped, {})
    ahead = [c for c, o in got if o == {"idx_ahead": True}]
    plain = [c for c, o in got[1:] if not o]
    assert 1 <= len(ahead) <= TOP and 1 <= len(plain) <= TOP
    assert len({json.dumps(x, sort_keys=True) for x in got}) == len(got)
    prev = json.loads(PREVIOUS.read_text())
    case = next(c for c in prev["cases"] if c["dtype"] == "bfloat16" and c["shape"]["batch"] == 16)
    fastest = min((r for r in case["configs"] if "idx_ahead" in r["us"]), key=lambda r: r["us"]["idx_ahead"])
    assert fastest["config"] in ahead


def test_the_wgmma_benchmark_skips_configs_of_more_than_two_waves_and_16_bit_partials_without_splits():
    """At batch 64 on 132 SMs: 2 splits of two programs (256) are timed, 3 splits of two (384) and 5 of one (320) are
    not; PART16 only where there are partials to store."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma import wgmma_configs
    from kernels.sparse_decode import split_rows

    at64 = wgmma_configs(64, sms=132)
    got = {(c["S"], c["BLOCK_T"], c["V_SPLIT"]) for c in at64}
    assert (2, 64, 2) in got and (4, 32, 1) in got and (1, 64, 2) in got
    assert (3, 64, 2) not in got and (5, 64, 1) not in got
    assert all(64 * split_rows(640, c["S"], c["BLOCK_T"])[1] * c["V_SPLIT"] <= 2 * 132 for c in at64)
    assert all(split_rows(640, c["S"], c["BLOCK_T"])[1] > 1 for c in wgmma_configs() if c["PART16"])
    assert len(wgmma_configs(1)) > len(at64)


def test_the_wgmma_benchmark_space_option_narrows_the_sweep_and_refuses_values_outside_the_kernels_space(tmp_path):
    """--space replaces some keys' values (here: P_SMEM 0, ring depths 2 and 4) and keeps both schedules (WS 0
    and 1) as twins, SPLIT_WG only where it runs (WS, two programs a split or more, an even ring) and SEESAW only
    where it runs (WS, one program a split); a value outside the kernel's space is a one-line error, exit 2, before
    anything is measured."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma import wgmma_configs

    narrow = wgmma_configs(16, sms=132, space={"P_SMEM": [0], "STAGES": [2, 4]})
    assert {c["P_SMEM"] for c in narrow} == {0} and {c["STAGES"] for c in narrow} == {2, 4}
    assert {json.dumps({**c, "WS": 0}, sort_keys=True) for c in narrow if c["WS"] and not (c["SPLIT_WG"] or c["SEESAW"])} \
        == {json.dumps(c, sort_keys=True) for c in narrow if not c["WS"]}
    split = [c for c in narrow if c["SPLIT_WG"]]  # a warp-specialised schedule of two or more programs a split
    assert split and all(c["WS"] == 1 and c["V_SPLIT"] > 1 and c["STAGES"] % 2 == 0 for c in split)
    seesaw = [c for c in narrow if c["SEESAW"]]  # warp-specialised, one program a split, no staging of the stores
    assert seesaw and all(c["WS"] == 1 and c["V_SPLIT"] == 1 and not (c["STORE_CVT"] or c["SPLIT_WG"] or c["MERGE"])
                          for c in seesaw)
    assert len(narrow) < len(wgmma_configs(16, sms=132))
    with pytest.raises(ValueError, match=r"WS=\[2\] not in the kernel's space"):
        wgmma_configs(16, space={"WS": [2]})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    for bad in ('{"WS": [2]}', '{"WS": 1}', "[1]", "{"):
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sparse_decode_wgmma.py"), "--json",
                            str(tmp_path / "x.json"), "--space", bad], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, (bad, r.stderr)
        assert not (tmp_path / "x.json").exists()


def test_the_wgmma_report_states_the_single_partition_schedules_best_beside_the_best():
    """The WS and SPLIT_WG columns: from a stored run whose configs have neither key (all single-partition), the
    WS=0 and SPLIT_WG=0 bests are the best, ratios of 1.00x; a WS=1 row twice as fast halves both, then a SPLIT_WG=1
    row twice as fast again halves the best once more (SPLIT_WG=0 best / best: 2.00x)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma import report

    data = json.loads((ROOT / "benchmarks" / "results" / "sparse_decode_wgmma" / "h200" / "2026-12-01_db89c65.json").read_text())
    line = next(x for x in report(data, "x.json").splitlines() if x.startswith("| 64 | 11.80 |"))
    assert line.split(" | ")[6:13] == ["30.8", "30.8", "30.8", "1.18x", "1.00x", "1.00x", "1.00x"], line
    case = next(c for c in data["cases"] if c["batch"] == 64)
    best = min((r for r in case["rows"] if r["kernel"] == "wgmma" and "us" in r), key=lambda r: r["us"])
    case["rows"].append({**best, "config": {**best["config"], "WS": 1}, "us": best["us"] / 2})
    line = next(x for x in report(data, "x.json").splitlines() if x.startswith("| 64 | 11.80 |"))
    assert line.split(" | ")[6:9] == ["30.8", "15.4", "15.4"] and line.split(" | ")[11:13] == ["2.00x", "1.00x"], line
    case["rows"].append({**best, "config": {**best["config"], "WS": 1, "SPLIT_WG": 1}, "us": best["us"] / 4})
    line = next(x for x in report(data, "x.json").splitlines() if x.startswith("| 64 | 11.80 |"))
    assert line.split(" | ")[6:9] == ["30.8", "15.4", "7.7"] and line.split(" | ")[11:13] == ["4.00x", "2.00x"], line


def test_the_one_wave_rules_count_the_gpus_own_sms(monkeypatch):
    """An H100 PCIe has 114 SMs, not the H200's 132: the split count set for another batch, and the fall-back to the
    default where one split of ``V_SPLIT`` programs a request is more than a wave, follow the GPU's SM count."""
    import kernels.sparse_decode_wgmma as w
    from kernels.sparse_decode import split_rows

    assert w.one_wave() == (torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available()
                            else w.ONE_WAVE)
    # batch 24, two programs a split, 64-row tiles: 2 splits (96 programs) fit 114 and 132; batch 13: 5 fit 132 only
    assert w.splits_within(24, 640, 2, 64, sms=114) == 2
    assert split_rows(640, w.splits_within(13, 640, 2, 64, sms=132), 64)[1] == 5
    assert split_rows(640, w.splits_within(13, 640, 2, 64, sms=114), 64)[1] == 4
    kernel = w.SparseDecodeWgmmaKernel.instance
    tuned = {**w.default_config(16, 640), "V_SPLIT": 2, "S": 4}
    at16 = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640}
    at60 = {**at16, "batch": 60}
    monkeypatch.setattr(w, "one_wave", lambda: 132)
    assert kernel.adapt_config(tuned, at16, at60) == {**tuned, "S": 1}  # 120 programs: one split fits
    monkeypatch.setattr(w, "one_wave", lambda: 114)
    assert kernel.adapt_config(tuned, at16, at60) == kernel.default_config(at60)  # 120 > 114: the default


def test_the_wgmma_default_config_launches_one_wave_of_programs_at_every_batch_that_fits_one():
    """At every batch up to 132 (V4-Flash's 640 rows) the default launches at most 132 programs (one an SM of an
    H200): the rule before 2026-12-01 rounded its split count up and launched a second wave at 108 of these batches
    (144 programs at batch 24, 192 at 48; ``benchmarks/sparse_decode_wgmma_batches.py`` keeps it)."""
    from kernels.sparse_decode import split_rows
    from kernels.sparse_decode_wgmma import ONE_WAVE, default_config

    for batch in range(1, ONE_WAVE + 1):
        got = default_config(batch, 640)
        programs = batch * got["V_SPLIT"] * split_rows(640, got["S"], got["BLOCK_T"])[1]
        assert programs <= ONE_WAVE, (batch, got, programs)
        assert got["S"] == split_rows(640, got["S"], got["BLOCK_T"])[1], (batch, got)  # S names its splits
    assert default_config(24, 640)["S"] == 2 and default_config(7, 640)["S"] == 5
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma_batches import default_before, programs

    assert sum(programs(default_before(b, 640), b) > ONE_WAVE for b in range(1, ONE_WAVE + 1)) == 108


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
        best = min((r for r in case["rows"] if r["kernel"] == "wgmma" and "us" in r and not r["config"].get("PART16")),
                   key=lambda r: r["us"])["config"]
        got = default_config(case["batch"], 640)
        assert got["BLOCK_T"] == best["BLOCK_T"] and got["V_SPLIT"] == best.get("V_SPLIT", 1), (case["batch"], got, best)
        assert (got["WS"], got["STORE_CVT"]) == (best.get("WS", 0), best.get("STORE_CVT", 0)), (case["batch"], got, best)
        assert (got["SPLIT_WG"], got["STAGES"]) == (best.get("SPLIT_WG", 0), best["STAGES"]), (case["batch"], got, best)
        assert split_rows(640, got["S"], got["BLOCK_T"]) == split_rows(640, best["S"], best["BLOCK_T"]), (case["batch"], got, best)


def test_the_workload_share_report_counts_only_sparse_decode_kernels():
    sys.path.insert(0, str(ROOT))
    from benchmarks.workload_attention_share import is_sparse_decode, report

    assert is_sparse_decode("_sparse_decode_wgmma_kernel") and is_sparse_decode("_combine_kernel")
    assert not is_sparse_decode("_indexer_kernel") and not is_sparse_decode("void cutlass::Kernel<sparse_decode>")
    data = {"meta": {"date": "d", "gpu": "g", "torch": "t", "triton": "tr", "commit": "c", "live_context": 512},
            "rows": [{"impl": "wgmma", "batch": 64, "step_kernels_us": 1000.0, "sparse_decode_us": 200.0}]}
    assert "| wgmma | 64 | 1000 | 200 | 20.0% | 1.250x |" in report(data, "x.json")


def test_the_benchmarks_report_a_stored_json_on_any_machine_and_refuse_to_measure_without_a_gpu(tmp_path):
    """benchmarks/report_cli.py, as sparse_decode_wgmma.py uses it: --report-from writes the report of the stored run;
    no --json and no --report-from, or --json on a machine without CUDA, exit 2 with one line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = ROOT / "benchmarks" / "sparse_decode_wgmma.py"
    data = ROOT / "benchmarks" / "results" / "sparse_decode_wgmma" / "h200" / "2026-12-01_db89c65.json"
    r = subprocess.run([sys.executable, str(script), "--report-from", str(data), "--out", str(tmp_path / "r.md")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "| 64 | 11.80 |" in (tmp_path / "r.md").read_text()
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--report-from" in r.stderr
    if not torch.cuda.is_available():
        r = subprocess.run([sys.executable, str(script), "--json", str(tmp_path / "x.json")], capture_output=True,
                           text=True, env=env)
        assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr and not (tmp_path / "x.json").exists()


def test_a_benchmark_run_stores_what_its_measure_returns_and_reports_from_it(tmp_path, monkeypatch):
    """report_cli.run, once ``measure`` returns its data (on a GPU, here a stand-in measure with CUDA said present):
    the data is stored at --json, whatever measure wrote there as it went, and the report is written from it; a
    measure that returns None (its one-line error printed) stores and reports nothing, exit 2."""
    from benchmarks.report_cli import run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    data = {"meta": {"date": "d"}, "rows": [{"us": 1.5}]}

    def measure(args, json_path):
        json_path.write_text('{"partial": true}')  # what a run cut short would have kept
        return data

    out, stored = tmp_path / "r.md", tmp_path / "x.json"
    assert run(["--json", str(stored), "--out", str(out)], "doc", out, lambda d, src: f"{d['rows']} from {src}\n",
               measure) == 0
    assert json.loads(stored.read_text()) == data
    assert out.read_text() == f"[{{'us': 1.5}}] from {stored}\n"
    none = tmp_path / "none.json"
    assert run(["--json", str(none), "--out", str(tmp_path / "n.md")], "doc", out, lambda d, src: "",
               lambda args, path: None) == 2
    assert not none.exists() and not (tmp_path / "n.md").exists()


def test_the_workload_report_states_the_wgmma_attention_against_the_hand_written_best_from_its_stored_run(tmp_path):
    """benchmarks/workload_gpu.py --report-from: the ratio to the hand-written best measured in the same run, from the
    stored JSON (the README quotes it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    data = ROOT / "benchmarks" / "results" / "workload" / "h200" / "2026-12-01_e53ca92_attention_wgmma.json"
    out = tmp_path / "w.md"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "workload_gpu.py"), "--report-from", str(data),
                        "--out", str(out)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert ("hand-written best, attention_impl=wgmma / hand-written best, measured side by side: c=1 0.991, "
            "c=16 0.999, c=64 1.004; geomean 0.998") in text
    assert text == (ROOT / "benchmarks" / "results" / "workload" / "h200" / "2026-12-01_e53ca92_attention_wgmma.md").read_text()


def test_the_timeline_report_reads_each_phase_and_the_sm_clock_from_the_stored_stamps():
    """benchmarks/sparse_decode_wgmma_timeline.py's report from stored stamps: each launch's rows normalised (timer
    stamps from the launch's first start, clock stamps from each program's own, an unreached stamp None and left out
    of its phases' medians), the SM clock from each program's cycles over its timer's nanoseconds, each phase's median
    in µs at that clock, the spread of the starts, the span to the last end, and the timeline build against the
    plain one."""
    from benchmarks.sparse_decode_wgmma_timeline import normalise, report

    def program(start_ns, first_tile, loop, sm):  # 2 GHz: 2 cycles a nanosecond
        c1 = 10**9 + sm
        clocks = {2: 100, 3: 2000, 4: 30000, 5: 1000, 6: first_tile, 7: first_tile + loop, 8: first_tile + loop + 3000,
                  9: 1000, 10: first_tile + 400, 11: first_tile + loop - 1000, 12: 0}  # 12: not reached (stays 0)
        row = [start_ns, c1] + [c1 + clocks[k] if clocks[k] else 0 for k in range(2, 13)]
        return row + [start_ns + (first_tile + loop + 3000) // 2, sm]

    launches = [[program(10**12 + 300 * p, 4000 + 200 * p, 30000, p) for p in range(4)] for _ in range(3)]
    stored = [normalise(run) for run in launches]
    assert stored[0][1][0] == 300 and stored[0][1][1] == 0 and stored[0][1][12] is None and stored[0][1][14] == 1
    meta = {"date": "d", "gpu": "NVIDIA H200", "torch": "t", "triton": "3.6.0", "commit": "abc", "rep_ms": 30,
            "sms": 132, "runs": 3, "empty_kernel_us": 1.6}
    row = {"batch": 64, "topk": 640, "config": {"S": 1, "BLOCK_T": 32, "SPLIT_WG": 1}, "plain_us": 26.0,
           "timeline_us": 26.26, "plain_err": 0.002, "timeline_err": 0.0021, "stamps": stored}
    text = report({"meta": meta, "rows": [row]}, "x.json")
    assert "plain build 26.0 µs, timeline build 26.3 µs (1.010x); relative error 0.00210" in text
    assert "4 programs; SM clock 2.00 GHz; the programs' starts spread over 0.90 µs" in text
    # the last program ends at 900 + (4600 + 33000) / 2 ns after the first start
    assert "first start to last end 19.70 µs" in text
    assert "| start to first tile landed (consumer 0) | 2.15 |" in text  # median of 4000..4600 cycles: 4300
    assert "| first tile landed to last products done (consumer 0) | 15.00 |" in text
    assert "| last products done to result written (consumer 0) | 1.50 |" in text
    assert "| last products done to hand-over written (consumer 1) | - |" in text  # stamp 12 never reached
    assert "| first tile landed to last products done (consumer 1) | 14.30 |" in text


def test_checked_ways_checks_and_times_each_way_with_its_own_arguments_and_keeps_no_time_for_a_wrong_one():
    """``benchmarks.common.checked_ways`` (the benchmarks' loop over the ways they time side by side): each way's
    keyword arguments reach the launch, its error is kept, its time only where the result was within tolerance, and
    ``say`` hears every way in order. On the CPU: the launch runs and is checked for real against the kernel's
    reference; only the timing (CUDA graphs) is replaced by a fixed number."""
    import benchmarks.common as bk

    i = SD.make_inputs(dict(SD.shapes("v4flash")[0], batch=2, topk=64, num_rows=512), "float32", "cpu", seed=3)
    heard, calls = [], []

    def launch(inputs, out, scale=1.0):
        calls.append(scale)
        return out.copy_(SD.reference(inputs) * scale)

    real = bk._time
    bk._time = lambda fn, sets, rep_ms: type("T", (), {"median_us": 7.5})()
    try:
        row = bk.checked_ways(SD, {"right": {}, "wrong": {"scale": 1.5}}, launch, [i], (i,), 1.0, {"batch": 2},
                              lambda way, us: heard.append((way, us)))
    finally:
        bk._time = real
    assert row["batch"] == 2 and row["right_err"] < 1e-6 and row["right_us"] == 7.5
    assert abs(row["wrong_err"] - 0.5) < 1e-3 and "wrong_us" not in row
    assert heard == [("right", 7.5), ("wrong", "wrong_result")] and 1.5 in calls


@pytest.mark.parametrize("commit", ["a572e83", "88b8d14"])
def test_the_stored_timeline_reports_are_rewritten_from_their_stamps(commit):
    """The timeline figures the kernel's notes quote: each stored report is what the benchmark's report makes of its
    stored stamps, byte for byte."""
    from benchmarks.sparse_decode_wgmma_timeline import report

    name = Path("benchmarks") / "results" / "sparse_decode_wgmma_timeline" / "h200" / f"2026-12-02_{commit}"
    data = json.loads((ROOT / f"{name}.json").read_text())
    text = report(data, f"{name}.json")
    assert text == (ROOT / f"{name}.md").read_text()


def test_the_pdl_benchmark_counts_each_defaults_programs_and_reports_each_launch_against_early(tmp_path):
    """benchmarks/sparse_decode_wgmma_pdl.py: the split and merge programs of a config (batch 1's default: 10 splits
    of 8 column programs, a merge of 2 column blocks x 64 heads; one split: no merge), and a stored run's report (the
    merge's programs for each idle SM, exit / early and plain / early, the worst error); it refuses to measure
    without a GPU."""
    sys.path.insert(0, str(ROOT))
    import benchmarks.sparse_decode_wgmma_pdl as pdl
    from kernels.sparse_decode_wgmma import default_config

    assert pdl.grids(1, default_config(1, 640)) == (80, 128)
    assert pdl.grids(16, default_config(16, 640)) == (128, 1024)
    assert pdl.grids(64, default_config(64, 640)) == (128, 0)
    data = {"meta": {"date": "d", "gpu": "NVIDIA H200", "torch": "t", "triton": "3.6.0", "commit": "abc", "sms": 132},
            "rows": [{"batch": 1, "config": {"S": 10}, "programs": 80, "merge_programs": 128, "idle_sms": 52,
                      "early_us": 8.0, "exit_us": 8.8, "plain_us": 9.2, "early_err": 0.002, "exit_err": 0.003,
                      "plain_err": 0.002},
                     {"batch": 24, "config": {"S": 3}, "programs": 144, "merge_programs": 1536, "idle_sms": -12,
                      "early_us": 20.0, "exit_us": 19.0, "early_err": 0.002, "exit_err": 0.002, "plain_err": 0.5}]}
    text = pdl.report(data, "x.json")
    assert "| 1 | S=10 | 80 | 128 | 52 | 2.5 | 8.0 | 8.8 | 9.2 | 1.10x | 1.15x | 0.00300 |" in text
    assert "| 24 | S=3 | 144 | 1536 | -12 | none idle | 20.0 | 19.0 | wrong_result | 0.95x | - | 0.50000 |" in text
    assert "widened" not in text  # a run before the widened merge
    data["rows"][0].update(wide_merge_programs=512, early_wide_us=7.5, exit_wide_us=8.0, early_wide_err=0.002,
                           exit_wide_err=0.004)
    assert "| 1 | 128 | 512 | 8.0 | 7.5 | 8.8 | 8.0 | 1.07x | 1.10x | 0.00400 |" in pdl.report(data, "x.json")
    assert pdl.grids(1, default_config(1, 640), min_merge_programs=512) == (80, 512)
    script = ROOT / "benchmarks" / "sparse_decode_wgmma_pdl.py"
    r = subprocess.run([sys.executable, str(script), "--json", str(tmp_path / "x.json")], capture_output=True, text=True,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2 and "measuring needs a CUDA GPU" in r.stderr


def test_the_batches_benchmark_puts_each_batchs_config_now_beside_before(tmp_path, monkeypatch):
    """benchmarks/sparse_decode_wgmma_batches.py: at batch 24 the frozen rule from before launches 144 programs and the
    default now 96; a batch-16 tuned config runs as tuned before (192 programs) and with its splits set now (96); its
    report states each way's time, programs and before / now."""
    sys.path.insert(0, str(ROOT))
    import benchmarks.sparse_decode_wgmma_batches as bb
    from kernels import configs
    from kernels.configs import write_config_file

    monkeypatch.setenv("TUNER_KERNEL_CONFIG_DIR", str(tmp_path))
    configs.clear_cache()
    wg = get_kernel("sparse_decode_wgmma")
    shape = dict(SD.shapes("v4flash")[0], batch=16)
    tuned = {**wg.default_config(shape), "S": 4, "V_SPLIT": 2, "WS": 1}
    write_config_file("sparse_decode_wgmma", configs.gpu_name(), "bfloat16", {wg.shape_key(shape): {"config": tuned}})
    got = bb.configs_for(24, dict(shape, batch=24), None)
    configs.clear_cache()
    assert {w: bb.programs(c, 24) for w, c in got.items()} == {"tuned_before": 192, "tuned_now": 96,
                                                                "default_before": 144, "default_now": 96}
    rows = [{"batch": 24, "way": w, "config": c, "programs": bb.programs(c, 24), "err": 0.002, "us": us}
            for (w, c), us in zip(got.items(), (30.0, 20.0, 27.0, 20.0))]
    text = bb.report({"meta": {"date": "d", "gpu": "NVIDIA H200", "torch": "t", "triton": "3.6.0", "commit": "abc"},
                      "rows": rows}, "x.json")
    assert "| 24 | 30.0 (192) | 20.0 (96) | 1.50x | 27.0 (144) | 20.0 (96) | 1.35x |" in text


def test_the_locality_probe_rewrites_only_the_indices_and_reports_each_pattern_against_spread(tmp_path):
    """benchmarks/sparse_decode_wgmma_locality.py: ``shared`` gives every request the first request's rows and
    ``one_row`` one row everywhere, nothing else of the inputs changes; the report states spread / each pattern from
    the stored rows, and the script says in one line that measuring needs a GPU."""
    sys.path.insert(0, str(ROOT))
    import benchmarks.sparse_decode_wgmma_locality as loc

    kernel = get_kernel("sparse_decode")
    inputs = kernel.make_inputs({**kernel.shapes("v4flash")[0], "batch": 3}, "float32", "cpu", seed=5)
    shared, one = loc.with_pattern(inputs, "shared"), loc.with_pattern(inputs, "one_row")
    assert torch.equal(shared["indices"], inputs["indices"][:1].repeat(3, 1)) and shared["q"] is inputs["q"]
    assert (one["indices"] == inputs["indices"][0, 0]).all() and one["indices"].shape == inputs["indices"].shape
    assert not torch.equal(inputs["indices"][1], inputs["indices"][0])  # the spread pattern is left as it was
    cfg = loc.configs(64)[0]
    rows = [{"batch": 64, "config": cfg, "pattern": p, "err": 0.002, "status": "ok", "us": us}
            for p, us in (("spread", 30.0), ("shared", 20.0), ("one_row", 12.0))]
    rows += [{"batch": 64, "config": cfg, "pattern": "spread", "probe": p, "status": "probe", "us": us}
             for p, us in (("no_copies", 16.0), ("no_products", 24.0), ("indices_ahead", 36.0), ("qk_ahead", 25.0))]
    seesaw = loc.configs(64)[-1]  # SEESAW beside the batch's default, and at batch 16 (not at batch 1)
    assert seesaw["SEESAW"] == 1 and seesaw["V_SPLIT"] == 1 and not cfg.get("SEESAW")
    assert [c["S"] for c in loc.configs(16) if c.get("SEESAW")] == [8, 5] and not any(c.get("SEESAW") for c in loc.configs(1))
    rows += [{"batch": 64, "config": seesaw, "pattern": "spread", "err": 0.002, "status": "ok", "us": 40.0}]
    scaling = [{"topk": k, "config": cfg, "err": 0.002, "status": "ok", "us": 3.0 + 0.5 * k / 32} for k in (64, 320, 640)]
    data = {"meta": {"date": "d", "gpu": "G", "torch": "t", "triton": "tr", "commit": "c", "rep_ms": 1}, "rows": rows,
            "scaling": scaling}
    assert loc.fit(scaling) == pytest.approx((3.0, 0.5))
    path = tmp_path / "l.json"
    path.write_text(json.dumps(data))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = ROOT / "benchmarks" / "sparse_decode_wgmma_locality.py"
    r = subprocess.run([sys.executable, str(script), "--report-from", str(path), "--out", str(tmp_path / "l.md")],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "| 30.0 | 20.0 | 12.0 | 1.50x | 2.50x | 16.0 | 24.0 | 0.62 | 36.0 | 1.20x | 25.0 | 1.20x |" in (tmp_path / "l.md").read_text()
    assert "3.0 µs fixed" in (tmp_path / "l.md").read_text() and "+ 0.50 µs a tile" in (tmp_path / "l.md").read_text()
    assert "SEESAW=1: 40.0 µs against 30.0 (default / SEESAW 0.75x)" in (tmp_path / "l.md").read_text()
    if not torch.cuda.is_available():
        r = subprocess.run([sys.executable, str(script), "--json", str(tmp_path / "x.json")], capture_output=True,
                           text=True, env=env)
        assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr and not (tmp_path / "x.json").exists()


def test_the_wgmma_rates_report_projects_each_schedules_products_from_the_stored_rates(tmp_path):
    """benchmarks/wgmma_rates.py: the products' time of a schedule is its pairs x (scores' product + PV product) at
    the two-programs-an-SM rates, halved (two warpgroups share the SM); a missing rate leaves the cell empty."""
    sys.path.insert(0, str(ROOT))
    import benchmarks.wgmma_rates as wr

    rows = [{"mode": m, "N": n, "K": k, "per_sm": ps, "reps": 1, "us": 1.0, "err": 1e-3, "tflops": 100.0,
             "ns_per_product": ns}
            for m, n, k, ps, ns in (("SS", 32, 512, 2, 1000.0), ("RS", 256, 32, 2, 500.0), ("SS", 32, 512, 1, 1.0),
                                    ("RS", 128, 64, 2, 700.0))]
    data = {"meta": {"date": "d", "gpu": "G", "sms": 132, "torch": "t", "triton": "tr", "commit": "c"}, "rows": rows}
    assert wr.projection(data, 32, 256, 32, 20) == 20 * 1500.0 / 2 / 1e3
    assert wr.projection(data, 32, 256, 64, 10) is None
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "wgmma_rates.py"), "--report-from", str(path),
                        "--out", str(tmp_path / "r.md")], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "r.md").read_text()
    assert "| 64 x 32 x 512 | 64 x 256 x 32 | 20 + 20 | 15.0 |" in text
    assert "| 64 x 32 x 512 | 64 x 128 x 64 | 20 + 20 | 17.0 |" in text
    assert "| 64 x 32 x 512 | 64 x 256 x 64 | 10 + 10 | - |" in text


def test_the_workload_report_compares_a_found_bests_attention_variant_with_that_found_best(tmp_path):
    """A --study-best run with --attention-impl: the found best's wgmma variant is stated against the found best as
    measured in the same run (its "base"), the hand-written best's variant against the hand-written best."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.workload_gpu import DEFAULT, HAND_BEST

    found = "best found by `s` (trial 3, stored 100.00)"
    found_knobs = {**DEFAULT, "attention_impl": "mma", "context_length": 32768}
    levels = ["c=1", "c=64"]
    cases = [{"name": "default", "knobs": DEFAULT, "tok_s": {"c=1": 10.0, "c=64": 50.0}, "wall_s": 1},
             {"name": "hand-written best", "knobs": HAND_BEST, "tok_s": {"c=1": 40.0, "c=64": 400.0}, "wall_s": 1},
             {"name": "hand-written best, attention_impl=wgmma", "knobs": {**HAND_BEST, "attention_impl": "wgmma"},
              "tok_s": {"c=1": 44.0, "c=64": 400.0}, "wall_s": 1},
             {"name": found, "knobs": found_knobs, "tok_s": {"c=1": 20.0, "c=64": 200.0}, "wall_s": 1},
             {"name": f"{found}, attention_impl=wgmma", "knobs": {**found_knobs, "attention_impl": "wgmma"},
              "base": found, "tok_s": {"c=1": 25.0, "c=64": 180.0}, "wall_s": 1}]
    data = {"gpu": "G", "date": "d", "commit": "c", "torch": "t", "triton": "tr", "preset": "dsv4-flash",
            "repeats": 3, "levels": levels, "cases": cases,
            "compared": [found, "hand-written best, attention_impl=wgmma", f"{found}, attention_impl=wgmma"]}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "w.md"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "workload_gpu.py"), "--report-from", str(path),
                        "--out", str(out)], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert f"{found}, attention_impl=wgmma / {found}, measured side by side: c=1 1.250, c=64 0.900; geomean 1.061" in text
    assert "hand-written best, attention_impl=wgmma / hand-written best, measured side by side: c=1 1.100, c=64 1.000" in text
    assert f"{found} / hand-written best, measured side by side: c=1 0.500, c=64 0.500" in text


def test_the_kernels_benchmark_plans_the_wgmma_kernel_only_where_it_can_run(monkeypatch):
    """benchmarks/kernels.py: a sparse_decode_wgmma job (V4-Flash shapes, bf16, each batch's default config first,
    then a sample of the canonical space) where the kernel says it can run, none where it cannot."""
    sys.path.insert(0, str(ROOT))
    import benchmarks.kernels as bk
    from kernels.sparse_decode_wgmma import SparseDecodeWgmmaKernel, default_config

    monkeypatch.setattr(SparseDecodeWgmmaKernel, "unavailable", lambda self: "no sm_90 here")
    assert not [j for j in bk.plan(quick=True, gemm_sweep=False) if j["kernel"] == "sparse_decode_wgmma"]
    monkeypatch.setattr(SparseDecodeWgmmaKernel, "unavailable", lambda self: None)
    job = next(j for j in bk.plan(quick=True, gemm_sweep=False) if j["kernel"] == "sparse_decode_wgmma")
    assert job["dtype"] == "bfloat16" and [s["batch"] for s in job["shapes"]] == [1, 16, 64]
    defaults = [default_config(b, 640) for b in (1, 16, 64)]
    assert job["configs"][:3] == defaults and len(job["configs"]) > 20
    assert {c["WS"] for c in job["configs"]} == {0, 1}
    assert {c["STAGES"] for c in job["configs"][3:]} == {2}  # the sample: one ring depth (a default may have another)


def test_the_kernels_benchmark_times_the_wgmma_kernels_previous_schedule_at_its_best_config_once():
    """The previous version of the wgmma kernel is its single-partition schedule: the best config with WS flipped is
    timed unless the sweep already timed the same program (its canonical twin), and the WS=0 best counts it."""
    sys.path.insert(0, str(ROOT))
    import benchmarks.kernels as bk

    shape = dict(get_kernel("sparse_decode_wgmma").shapes("v4flash")[2])  # batch 64
    best = {"S": 1, "BLOCK_T": 64, "STAGES": 2, "P_SMEM": 0, "V_SPLIT": 2, "PART16": 0, "STORE_CVT": 1, "WS": 1,
            "MERGE": 0}
    timed = []

    def trial(cfg, tag):
        timed.append((cfg, tag))
        return {"config": cfg, "tag": tag, "outcome": "ok", "time_us": 31.0}

    row = {"trials": [{"config": best, "tag": "sweep", "outcome": "ok", "time_us": 28.5},
                      {"config": {**best, "S": 2, "V_SPLIT": 1, "WS": 0}, "tag": "sweep", "outcome": "ok",
                       "time_us": 33.0}]}
    bk._prev_schedule_rows(row, shape, trial, best)
    assert timed == [({**best, "WS": 0, "SPLIT_WG": 0, "SEESAW": 0}, "other_schedule")]  # keys it predates: defaults
    assert row["other_schedule"]["time_us"] == 31.0 and row["prev_best_us"] == 31.0
    timed.clear()
    bk._prev_schedule_rows(row, shape, trial, {**best, "SPLIT_WG": 1})  # the newest schedule: SPLIT_WG flipped,
    assert timed == [] and row["other_schedule"]["time_us"] == 28.5  # which the sweep timed (best, SPLIT_WG 0)
    row = {"trials": [{"config": {**best, "PART16": 1, "WS": 0}, "tag": "sweep", "outcome": "ok", "time_us": 30.0}]}
    timed.clear()
    bk._prev_schedule_rows(row, shape, trial, best)  # PART16 with one split is the same program as PART16=0
    assert timed == [] and row["other_schedule"]["time_us"] == 30.0 and row["prev_best_us"] == 30.0
    seesaw = {**best, "S": 2, "V_SPLIT": 1, "STORE_CVT": 0, "SEESAW": 1}  # SEESAW flipped, not WS (its WS is 1 anyway)
    bk._prev_schedule_rows(row, shape, trial, seesaw)
    assert timed == [({**seesaw, "SPLIT_WG": 0, "SEESAW": 0}, "other_schedule")]


def test_the_kernels_report_puts_the_wgmma_kernel_beside_the_tl_dot_best_torch_floor_and_its_previous_schedule():
    sys.path.insert(0, str(ROOT))
    import benchmarks.kernels as bk

    shape = dict(get_kernel("sparse_decode_wgmma").shapes("v4flash")[2])
    key = get_kernel("sparse_decode").shape_key(shape)
    base = {"dtype": "bfloat16", "shape": shape, "key": key, "floor_us": 11.8, "bound": "memory", "torch_us": 108.0,
            "n_ok": 1, "n_failed": 0, "trials": []}
    rows = [dict(base, kernel="sparse_decode", default_us=40.0, best_us=36.0, best_config={"S": 2}),
            dict(base, kernel="sparse_decode_wgmma", default_us=29.0, shipped_us=28.0, best_us=27.0,
                 best_config={"S": 1, "WS": 1}, other_schedule={"time_us": 30.0}, prev_best_us=29.7)]
    meta = {"gpu": "NVIDIA H200", "date": "d", "sms": 132, "torch": "t", "triton": "3.6.0", "cuda": "c",
            "commit": "abc", "bw": 4.2e12, "flops": 7e14, "wall_s": 1.0, "precompile_s": 0.0}
    text = bk.report(rows, meta)
    line = next(x for x in text.splitlines() if x.startswith("| 64 | 11.80 | 108.0 | 36.0 |"))
    cells = line.split(" | ")
    assert cells[4:13] == ["29.0", "28.0", "27.0", "30.0", "29.7", "1.33x", "1.10x", "4.0x", "2.29x"], cells
    assert "missed: 10.0 µs over 17" in line
    assert "- sparse decode wgmma B=64 <= 17 us: 27.0 us" in text


def test_the_kernels_report_states_the_wgmma_merge_launched_three_ways_beside_the_best():
    """Where the best config has a merge kernel, the report puts its time (the launcher's rule) beside the same
    config with the merge started at once, started only as the split kernel exits (the launch before 2026-12-01) and
    with plain launches; a batch whose best has no merge kernel (one split) has no such line."""
    sys.path.insert(0, str(ROOT))
    import benchmarks.kernels as bk

    wg = get_kernel("sparse_decode_wgmma")
    rows = []
    for b, extra in ((1, {"best_no_trigger_us": 9.0, "best_no_pdl_us": 9.9}), (64, {})):
        shape = dict(wg.shapes("v4flash")[0], batch=b)
        rows.append({"kernel": "sparse_decode_wgmma", "dtype": "bfloat16", "shape": shape,
                     "key": wg.shape_key(shape), "floor_us": 0.2, "bound": "memory", "torch_us": 34.0, "n_ok": 1,
                     "n_failed": 0, "trials": [], "default_us": 8.5, "best_us": 8.2, "best_config": {"S": 10},
                     **extra})
    rows[0]["best_early_us"] = 8.1
    lines = bk.sparse_decode_wgmma_table(rows)
    assert "| 1 | 8.2 | 8.1 | 9.0 | 9.9 | 0.99x | 1.10x | 1.21x |" in lines
    assert any("best = the launcher's choice (`merge_starts_early`)" in x for x in lines)
    del rows[0]["best_early_us"]  # a run at a0b4bea, before the rule: its best is the early launch
    old = bk.sparse_decode_wgmma_table(rows)
    assert "| 1 | 8.2 | 8.2 | 9.0 | 9.9 | 1.00x | 1.10x | 1.21x |" in old
    assert any("best = early (this run's launcher started every merge early)" in x for x in old)
    assert not [x for x in lines[lines.index("| --- | --- | --- | --- | --- | --- | --- | --- |"):] if x.startswith("| 64 |")]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("ws", [0, 1])
def test_sparse_decode_wgmma_merge_leaves_its_counters_at_zero_across_launches_and_graph_replays(ws):
    """MERGE's arrival counters are reset by each request's last program: eager launches one after another, then a
    CUDA graph replayed on fresh inputs, each matches the float32 reference, and the counters read zero after."""
    from kernels.sparse_decode_wgmma import _counters

    shape = dict(SD.shapes("v4flash")[0], batch=16)
    config = {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": ws, "MERGE": 1}
    sets = [SD.make_inputs(shape, "bfloat16", "cuda", seed=500 + k) for k in range(3)]
    for i in sets:
        got = sparse_decode_wgmma(i["q"], i["kv"], i["indices"], i["sm_scale"], config)
        assert rel_error(got, SD.reference(i)) <= SD.tolerance("bfloat16")
    static = {k: v.clone() if torch.is_tensor(v) else v for k, v in sets[0].items()}
    out = torch.empty(16, 64, 512, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_decode_wgmma(static["q"], static["kv"], static["indices"], static["sm_scale"], config, out=out)
    for i in sets[1:] + sets[:1]:
        for k in ("q", "kv", "indices"):
            static[k].copy_(i[k])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_error(out, SD.reference(i)) <= SD.tolerance("bfloat16")
    assert torch.count_nonzero(_counters("cuda", 32)[:32]) == 0


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("config", [
    {"S": 10, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 8, "WS": 0},  # batch 1's default
    {"S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1},  # batch 16's
    {"S": 4, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 2, "SPLIT_WG": 1},
    {"S": 5, "BLOCK_T": 32, "STAGES": 4, "V_SPLIT": 1, "SEESAW": 1},
], ids=["plain", "ws", "split_wg", "seesaw"])
@pytest.mark.parametrize("batch", [1, 16])
def test_sparse_decode_wgmma_chained_with_pdl_in_a_cuda_graph_matches_the_reference_at_every_step(batch, config):
    """Programmatic dependent launch, the merge started at once (``_pdl_trigger=True``, whatever the rule says for
    the batch), lets each merge kernel start before its split kernel ends: three calls chained
    in one CUDA graph, each call's q the previous call's output and its partials in the buffers the previous call
    freed, replayed into NaN-poisoned outputs; every step matches the float32 reference of its actual input (a merge
    that read its partials early, or a split that read q before the merge before it wrote it, would not)."""
    shape = dict(SD.shapes("v4flash")[0], batch=batch, ragged=1)
    i = SD.make_inputs(shape, "bfloat16", "cuda", seed=900 + batch)
    q0 = i["q"].clone()
    outs = [torch.empty(batch, 64, 512, device="cuda", dtype=torch.bfloat16) for _ in range(3)]

    def run(q, o):
        return sparse_decode_wgmma(q, i["kv"], i["indices"], i["sm_scale"], config, out=o, pdl=True,
                                   _pdl_trigger=True)

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


def test_the_wgmma_report_states_what_each_switch_gains_over_the_configs_timed_both_ways():
    """switch_gains: per batch, (time with the switch off) / (time with it on) over the configs timed both ways; WS
    also by the tiles a program walks. A stored run with no WS key has no such table; a WS=1 twin of every batch-64
    config at half the time reads 2.000x everywhere."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.sparse_decode_wgmma import switch_gains

    data = json.loads((ROOT / "benchmarks" / "results" / "sparse_decode_wgmma" / "h200" / "2026-12-01_db89c65.json").read_text())
    assert switch_gains(data) == []
    case = next(c for c in data["cases"] if c["batch"] == 64)
    timed = [r for r in case["rows"] if r["kernel"] == "wgmma" and "us" in r]
    for r in timed:
        r["config"]["WS"] = 0
        case["rows"].append({**r, "config": {**r["config"], "WS": 1}, "us": r["us"] / 2})
    lines = switch_gains(data)
    assert lines[1].startswith("WS=1 against WS=0")
    rows = [x.strip("| ").split(" | ") for x in lines if x.startswith("| 64 |")]
    assert rows[0][1:4] == ["all", str(len(timed)), "2.000x"] and all(r[3:6] == ["2.000x"] * 3 for r in rows)
    assert {r[1] for r in rows[1:]} <= {"1 tile", "2 tiles", "3 tiles", "4+ tiles"} and len(rows) > 2
    # MERGE had two on-values (MERGE=2 until 3d94924), each set against MERGE=0: a MERGE=2 twin of batch 16's
    # configs at a third of the time
    case16 = next(c for c in data["cases"] if c["batch"] == 16)
    timed16 = [r for r in case16["rows"] if r["kernel"] == "wgmma" and "us" in r and not r["config"].get("MERGE")]
    for r in timed16:
        r["config"]["MERGE"] = 0
    case16["rows"] += [{**r, "config": {**r["config"], "MERGE": 2}, "us": r["us"] / 3} for r in timed16]
    lines = switch_gains(data)
    at = lines.index(next(x for x in lines if x.startswith("MERGE=2 against MERGE=0")))
    assert not any(x.startswith("MERGE=1 against") for x in lines)  # no MERGE=1 twin was timed
    rows = [x.strip("| ").split(" | ") for x in lines[at:] if x.startswith("| 16 |")]
    assert timed16 and rows[0][1:6] == ["all", str(len(timed16)), "3.000x", "3.000x", "3.000x"]


@pytest.mark.parametrize("batch, pairs, median", [(16, 64, "0.949x"), (1, 69, "0.900x")])
def test_the_stored_spread_merge_runs_are_reported_byte_for_byte_with_merge2_against_merge0(tmp_path, batch, pairs,
                                                                                            median):
    """The two H200 runs of MERGE=2 (the spread merge, removed after them) are reported from their JSON exactly as
    committed, and the report sets MERGE=2 against MERGE=0 over every config timed both ways."""
    name = Path("benchmarks") / "results" / "sparse_decode_wgmma_merge2" / "h200" / f"2026-12-02_3057f3e_b{batch}"
    out = tmp_path / "r.md"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sparse_decode_wgmma.py"), "--report-from",
                        str(ROOT / f"{name}.json"), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    assert text == (ROOT / f"{name}.md").read_text()
    lines = text.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("MERGE=2 against MERGE=0")))
    assert next(x for x in lines[at:] if x.startswith(f"| {batch} | all |")).startswith(f"| {batch} | all | {pairs} | {median} |")


def test_the_fp8_benchmark_reports_its_stored_run_and_rewrites_the_shipped_fp8_tuned_file_from_it(tmp_path):
    """The stored H200 run's report is regenerated byte for byte, and the shipped fp8 tuned file of the wgmma kernel
    is exactly what ``--write-tuned`` writes from that run (the sweep's fastest config a batch, each passing the fp8
    rules, none slower than the default it was timed beside)."""
    stored = ROOT / "benchmarks" / "results" / "sparse_decode_wgmma_fp8" / "h200" / "2026-12-01_4ac0e78.json"
    shipped = ROOT / "kernels" / "tuned" / "sparse_decode_wgmma__NVIDIA_H200__float8_e4m3fn__triton-3.6.0.json"
    out = tmp_path / "r.md"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sparse_decode_wgmma_fp8.py"), "--report-from",
                        str(stored), "--out", str(out), "--write-tuned", str(tmp_path)], capture_output=True, text=True,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert out.read_text() == (ROOT / "benchmarks" / "results" / "sparse_decode_wgmma_fp8" / "h200" / "2026-12-01_4ac0e78.md").read_text()
    assert (tmp_path / shipped.name).read_text() == shipped.read_text()
    k = get_kernel("sparse_decode_wgmma")
    for key, entry in json.loads(shipped.read_text()).items():
        shape = dict(V4, batch=int(key.split("batch=")[1].split(",")[0]))
        assert k.check_config(entry["config"], shape, None, FP8) is None
        assert entry["time_us"] <= entry["default_time_us"]
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sparse_decode_wgmma_fp8.py"), "--write-tuned",
                          str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.strip() == ("error: --write-tuned DIR needs --report-from FILE.json (the "
                                                          "stored run it takes the configs from)")
