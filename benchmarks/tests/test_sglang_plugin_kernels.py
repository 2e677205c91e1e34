"""benchmarks/sglang_plugin_kernels.py on a CPU: its torch stand-in computes SGLang's fused_q_norm_rope semantics,
it refuses to time without a GPU, and --store --from keeps a run's records in a study, where the export reads them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "sglang_plugin_kernels.py"


def test_the_torch_stand_in_computes_sglangs_semantics():
    from kernels.sglang_q_norm_rope import q_norm_rope_reference
    from tuner.export.sglang_plugin_measure import torch_q_norm_rope

    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 4, 128, generator=g, dtype=torch.float32)
    ang = torch.rand(50, 32, generator=g)
    freqs = torch.polar(torch.ones_like(ang), ang)
    pos = torch.randint(0, 50, (3,), generator=g)
    for eps in (1e-6, None):
        out = torch.full_like(q, float("nan"))
        torch_q_norm_rope(q, out, eps, freqs, pos)
        ref = q_norm_rope_reference(q, eps, freqs, pos)
        assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-6


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_without_a_gpu_or_a_storage_it_says_what_to_give_and_exits_2():
    if not torch.cuda.is_available():
        done = _run("--out", "/nonexistent/never-written")
        assert done.returncode == 2 and done.stderr.startswith("error: no CUDA device"), done.stderr
    done = _run("--store", "s")
    assert done.returncode == 2 and done.stderr.startswith("error: --store needs --storage URL"), done.stderr


def test_store_from_a_json_keeps_the_records_in_the_study(tmp_path):
    from storage import Repo
    from tuner.export.sglang_plugin import read_records

    url = f"sqlite:///{tmp_path / 't.db'}"
    repo = Repo(url)
    repo.create_schema()
    run = repo.create_run("twin-st", target="workload", budget_s=60, objective="geomean of tok_s")
    rec = {
        "target": "sglang.kernels.ops.attention.dsv4.norm_rope.fused_q_norm_rope",
        "batch": 16,
        "shape": {"heads": 64, "head_dim": 512, "rope_dim": 64, "norm": True},
        "dtypes": {"dtype": "bfloat16", "out_dtype": "bfloat16"},
        "ours_us": 3.1,
        "sglang_us": 3.4,
        "rel_err": 0.004,
        "gpu": "NVIDIA H200",
        "arch": "sm_90",
        "date": "2026-12-03T06:00",
        "commit": "abc",
        "sglang": "0.5.23",
        "baseline": "sglang",
        "config": {"BLOCK_H": 2, "num_warps": 4},
        "graph_rel_err": 0.004,
        "source": "sglang_plugin_kernels.json",
    }
    path = tmp_path / "sglang_plugin_kernels.json"
    path.write_text(json.dumps({"records": [rec]}))
    done = _run("--store", "twin-st", "--storage", url, "--from", str(path))
    assert done.returncode == 0, done.stderr
    (got,) = read_records(repo, run.id)
    assert (got.batch, got.ours_us, got.sglang_us, got.config) == (16, 3.1, 3.4, {"BLOCK_H": 2, "num_warps": 4})
