"""What the real-server GPU benchmarks share: the command line of the model and the machine, the check for the
packages they need, the GPU's name and memory (``nvidia-smi``), the tiny random Llama they serve and the settings
that start ``transformers serve`` on it. Used by ``real_server_gpu.py`` and ``real_server_goodput_gpu.py``.

Needs, beside torch: this project's wheels and transformers' serving extra. On the H200 image (Python 3.12, torch
2.11, transformers 5.17 without fastapi/openai), carry ``.whl`` made here with
``bash shared/offline-wheels.sh .whl 3.12 pydantic-settings python-dotenv openai==2.54.0 jiter distro
transformers==5.24.0 tqdm typing-extensions`` and start the command with the install line of the device README.
The server is started as ``python -c '...transformers.cli.transformers main' serve`` so that a ``transformers``
installed with ``pip --target`` (no console script on PATH) is the one that runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# the trial processes and the servers import tuner from here too (nothing is installed on the GPU image)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)

SERVE = "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; main()"
NEEDED = (
    "torch",
    "transformers",
    "fastapi",
    "uvicorn",
    "openai",
    "optuna",
    "sqlalchemy",
    "pydantic_settings",
    "tokenizers",
    "safetensors",
    "typer",
    "rich",
    "httpx",
    "yaml",
)


def add_common_args(ap: argparse.ArgumentParser, budget_s: float) -> None:
    """The options both benchmarks take: the budget, the device and GPU, the model's size, the seed, the commit
    recorded and where the results go."""
    ap.add_argument("--budget-s", type=float, default=budget_s)
    ap.add_argument("--n-trials", type=int, default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--gpu", type=int, default=0, help="the GPU (CUDA_VISIBLE_DEVICES for the servers)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", default=os.environ.get("TUNER_COMMIT", ""))
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))


def missing_packages() -> list[str]:
    """The packages of :data:`NEEDED` this Python cannot import."""
    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def gpu_memory_mib(index: int) -> float | None:
    """Used memory of GPU ``index`` as nvidia-smi reports it (every process on it), or None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(
        ["nvidia-smi", "-i", str(index), "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    try:
        return float(out.stdout.strip().splitlines()[0])
    except (IndexError, ValueError):
        return None


def gpu_name(index: int) -> str:
    if shutil.which("nvidia-smi") is None:
        return "none (CPU)"
    out = subprocess.run(
        ["nvidia-smi", "-i", str(index), "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    return out.stdout.strip() or "unknown"


def version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _v

    try:
        return _v(name)
    except PackageNotFoundError:
        return None


def tiny_model_builder():
    """``tests/real_server/tiny_model.py``'s builder, loaded by path (another package named ``tests`` may be
    installed on the image)."""
    spec = importlib.util.spec_from_file_location("tiny_model", ROOT / "tests" / "real_server" / "tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_tiny_llama


def build_model(args: argparse.Namespace, dest: Path) -> tuple[Path, float]:
    """The random Llama of ``args``' size at ``dest``, and the seconds it took."""
    t0 = time.time()
    model = tiny_model_builder()(
        dest,
        hidden=args.hidden,
        layers=args.layers,
        heads=max(4, args.hidden // 64),
        kv_heads=max(2, args.hidden // 256),
        dtype=args.dtype,
        seed=args.seed,
    )
    return model, time.time() - t0


def serve_settings(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """The target settings that start ``transformers serve`` on ``model`` on ``args``' device and GPU."""
    return {
        "model": str(model),
        "command": [
            sys.executable,
            "-c",
            SERVE,
            "serve",
            "{model}",
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--device",
            args.device,
            "--dtype",
            args.dtype,
        ],
        "env": {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": str(args.gpu)},
    }


def model_doc(args: argparse.Namespace, build_s: float) -> dict[str, Any]:
    return {"hidden": args.hidden, "layers": args.layers, "dtype": args.dtype, "build_s": build_s}


def fmt(x, spec: str = ".1f") -> str:
    """``x`` formatted, ``-`` for None."""
    return "-" if x is None else format(x, spec)


def copy_study_db(src: Path, dst: Path) -> None:
    """Copy a study's SQLite database whole, with what its write-ahead log still holds (a plain file copy while the
    search's engine is open leaves the trials in ``-wal`` behind: an H200 run brought back an empty database so)."""
    import sqlite3

    dst.unlink(missing_ok=True)
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
