"""Tuned-config files: naming, atomic merge-writes, nearest-key lookup, fallbacks."""

import json
import logging
import threading

import pytest
import triton

from kernels import configs, get_kernel
from kernels.configs import config_path, lookup, nearest_key, read_config_file, write_config_file

SD = get_kernel("sparse_decode")
SHAPE = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 1000}
TUNED = {"S": 4, "BLOCK_H": 32, "BLOCK_T": 64, "num_warps": 8, "num_stages": 2}


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_KERNEL_CONFIG_DIR", str(tmp_path))
    configs.clear_cache()
    yield tmp_path
    configs.clear_cache()


def _write(entries, dtype="bfloat16"):
    return write_config_file("sparse_decode", configs.gpu_name(), dtype, entries)


def test_file_name_has_kernel_gpu_dtype_and_triton_version(config_dir):
    path = config_path("sparse_decode", "NVIDIA H200", "bf16", "3.6.0")
    assert path == config_dir / "sparse_decode__NVIDIA_H200__bfloat16__triton-3.6.0.json"
    assert (
        config_path("gemm", "NVIDIA H200", "tf32").name == f"gemm__NVIDIA_H200__tf32__triton-{triton.__version__}.json"
    )


def test_write_merges_and_leaves_no_temporary_files(config_dir):
    k16, k64 = SD.shape_key(SHAPE), SD.shape_key(dict(SHAPE, batch=64))
    _write({k16: {"config": TUNED, "time_us": 20.0, "default_time_us": 30.0}})
    path = _write({k64: {"config": dict(TUNED, S=1), "time_us": 40.0, "default_time_us": 41.0}})
    data = json.loads(path.read_text())
    assert set(data) == {k16, k64} and data[k16]["time_us"] == 20.0
    assert [p.name for p in config_dir.iterdir()] == [path.name]


def test_concurrent_writers_never_leave_a_torn_file(config_dir):
    def writer(i):
        for j in range(15):
            _write({f"batch={i * 100 + j},d_qk=512,d_v=512,heads=64,topk=640": {"config": TUNED, "time_us": 1.0}})

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    path = config_path("sparse_decode", configs.gpu_name(), "bfloat16")
    data = json.loads(path.read_text())  # valid JSON: rename is atomic
    # writers take turns: no entry is lost (without the lock a merge could start from a file another writer was
    # about to replace; CI once kept 14 of these 60)
    assert len(data) == 60
    assert not [p for p in config_dir.iterdir() if p.suffix == ".tmp"]


def _process_writer(directory: str, i: int) -> None:
    from kernels.configs import write_config_file

    for j in range(15):
        write_config_file(
            "sparse_decode",
            "cpu",
            "bfloat16",
            {f"batch={i * 100 + j},d_qk=512,d_v=512,heads=64,topk=640": {"config": TUNED, "time_us": 1.0}},
            directory=directory,
        )


def test_writer_processes_keep_every_entry(tmp_path):
    """Kernel searches in separate processes writing one tuned file at the same time: all their entries survive."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_process_writer, args=(str(tmp_path), i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    (path,) = tmp_path.iterdir()
    assert len(json.loads(path.read_text())) == 60


def test_write_rejects_entries_without_config():
    with pytest.raises(ValueError, match="entry for key"):
        _write({"batch=1": {"time_us": 1.0}})


def test_nearest_key_same_dims_nearest_batch_in_log_space():
    keys = ["batch=1,d=8", "batch=16,d=8", "batch=64,d=8", "batch=4,d=9"]
    assert nearest_key(keys, "batch=3,d=8", "batch") == "batch=1,d=8"  # log: 3 is nearer 1 than 16
    assert nearest_key(keys, "batch=5,d=8", "batch") == "batch=16,d=8"
    assert nearest_key(keys, "batch=32,d=8", "batch") == "batch=16,d=8"  # tie 16/64 -> smaller
    assert nearest_key(keys, "batch=500,d=8", "batch") == "batch=64,d=8"
    assert nearest_key(keys, "batch=4,d=7", "batch") is None


def test_lookup_missing_file_gives_default():
    assert lookup("sparse_decode", SHAPE, "bfloat16") == SD.default_config(SHAPE)


def test_lookup_takes_nearest_tuned_entry():
    _write({SD.shape_key(dict(SHAPE, batch=32)): {"config": TUNED, "time_us": 1.0, "default_time_us": 2.0}})
    # the nearest key's tiles, its split count set for this batch (SparseDecodeKernel.adapt_config: one wave)
    at20 = lookup("sparse_decode", dict(SHAPE, batch=20), "bfloat16")
    assert at20 == {**TUNED, "S": SD.splits_in_one_wave(TUNED, dict(SHAPE, batch=20))} and at20["S"] != TUNED["S"]
    assert lookup("sparse_decode", dict(SHAPE, batch=32), "bfloat16") == TUNED  # at its own batch, as tuned
    assert lookup("sparse_decode", dict(SHAPE, batch=20, topk=2048), "bfloat16") == SD.default_config(
        dict(SHAPE, batch=20, topk=2048)
    )
    assert lookup("sparse_decode", SHAPE, "float16") == SD.default_config(SHAPE)  # other dtype, other file


def test_unreadable_file_gives_default_and_a_warning(caplog):
    path = config_path("sparse_decode", configs.gpu_name(), "bfloat16")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="kernels.configs"):
        assert lookup("sparse_decode", SHAPE, "bfloat16") == SD.default_config(SHAPE)
    assert "unreadable" in caplog.text
    assert read_config_file(path) == {}


def test_tuned_config_that_cannot_run_is_ignored(caplog):
    bad = dict(TUNED, BLOCK_H=64, BLOCK_T=128, num_stages=3)
    _write({SD.shape_key(SHAPE): {"config": bad, "time_us": 1.0}})
    with caplog.at_level(logging.WARNING, logger="kernels.configs"):
        assert lookup("sparse_decode", SHAPE, "bfloat16") == SD.default_config(SHAPE)
    assert "shared_memory" in caplog.text


def test_shipped_tuned_files_hold_runnable_configs(monkeypatch):
    """Every entry of kernels/tuned/*.json passes its kernel's check_config for the key's shape."""
    from pathlib import Path

    tuned = Path(configs.__file__).parent / "tuned"
    files = sorted(tuned.glob("*.json"))
    assert files, "no tuned-config files shipped"
    for path in files:
        kernel_name, gpu, dtype, version = path.stem.split("__")
        kernel = get_kernel(kernel_name)
        for key, entry in read_config_file(path).items():
            shape = {k: int(v) for k, v in (item.split("=") for item in key.split(","))}
            assert kernel.shape_key(shape) == key, (path.name, key)
            why = kernel.check_config({**kernel.default_config(shape), **entry["config"]}, shape, dtype=dtype)
            assert why is None, (path.name, key, why)
            assert entry["time_us"] <= entry["default_time_us"] * 1.02


def test_gpu_name_of_a_cpu_device_is_cpu_on_a_gpu_host_too(monkeypatch):
    """On the H200 host, resolving a CPU tensor's implementation asked torch for the name of device "cpu", which
    raises ("Expected a cuda device"); a CPU device reads the CPU's tuned files wherever it runs."""
    import torch

    def name(device=None):
        if device is not None and torch.device(device).type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        return "NVIDIA H200"

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", name)
    assert configs.gpu_name("cpu") == "cpu" and configs.gpu_name(torch.device("cpu")) == "cpu"
    assert configs.gpu_name() == configs.gpu_name("cuda") == configs.gpu_name("cuda:0") == "NVIDIA H200"


def test_a_wgmma_config_tuned_at_another_batch_gets_its_splits_set_for_the_batch_it_is_looked_up_at():
    """The nearest key's config keeps its tiles and switches, but its split count is set so that the batch launches
    one wave of programs: a batch-16 config of 4 splits of two programs (128 programs) gets 2 splits at batch 24 (96,
    not 192) and at 32 (128, not 256), keeps 4 at 16, and at batch 96 (two programs a request do not fit in 128) the
    batch's default config."""
    wg = get_kernel("sparse_decode_wgmma")
    shape = {"batch": 16, "heads": 64, "d_qk": 512, "d_v": 512, "topk": 640, "num_rows": 65536}
    tuned = {**wg.default_config(shape), "S": 4, "BLOCK_T": 64, "STAGES": 2, "V_SPLIT": 2, "WS": 1, "STORE_CVT": 1}
    write_config_file("sparse_decode_wgmma", configs.gpu_name(), "bfloat16", {wg.shape_key(shape): {"config": tuned}})
    assert lookup("sparse_decode_wgmma", shape, "bfloat16") == tuned
    for batch, splits in ((24, 2), (32, 2), (8, 5)):  # 8: 10 splits of one tile are 160 programs, 5 of two 80
        assert lookup("sparse_decode_wgmma", dict(shape, batch=batch), "bfloat16") == dict(tuned, S=splits), batch
    b96 = dict(shape, batch=96)
    assert lookup("sparse_decode_wgmma", b96, "bfloat16") == wg.default_config(b96)
