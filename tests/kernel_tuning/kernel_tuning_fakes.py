"""Fake tunable kernels for the kernel-tuning tests (imported by trial subprocesses through PYTHONPATH).

* :class:`TinyKernel`: one field ``X`` in 1..6 with known behaviour: 1 = the default (100 us), 2 segfaults,
  3 is the fastest but wrong, 4 is the true best (50 us), 5 breaks a ``check_config`` rule, 6 runs (60 us).
* :class:`ReplayKernel`: the split-K sparse decode kernel as recorded on one H200 at batch 16
  (``tests/kernels/data/sparse_decode_sweep_h200_b16.json``): its config space, its rules, the recorded time of
  each config, ``OutOfResources`` where the sweep failed, and a wrong result for the recorded best config.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import torch

from kernels.base import Cost, OutOfResources, TunableKernel
from kernels.sparse_decode import SparseDecodeKernel

TABLE = Path(__file__).resolve().parents[1] / "kernels" / "data" / "sparse_decode_sweep_h200_b16.json"


class _Identity(TunableKernel):
    """Output = 2 * x, correct unless ``wrong`` says so; a few µs of real work on a CPU."""

    def make_inputs(self, shape, dtype, device, seed=0):
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(4, 8, generator=g).to(device)}

    def output_like(self, inputs):
        return torch.empty_like(inputs["x"])

    def reference(self, inputs):
        return inputs["x"].double() * 2

    def tolerance(self, dtype):
        return 1e-3

    def wrong(self, config) -> bool:
        return False

    def run(self, inputs, config=None, out=None):
        out = torch.empty_like(inputs["x"]) if out is None else out
        out.copy_(inputs["x"] * (3 if self.wrong(config) else 2))
        return out


class TinyKernel(_Identity):
    name = "tiny"
    batch_dim = "batch"
    TIMES = {1: 100.0, 3: 10.0, 4: 50.0, 6: 60.0}

    def default_config(self, shape):
        return {"X": 1}

    def config_space(self, shape):
        return {"X": [1, 2, 3, 4, 5, 6]}

    def check_config(self, config, shape, device=None, dtype=None):
        why = super().check_config(config, shape, device)
        if why:
            return why
        if config["X"] == 5:
            return "too_big: X=5 > 4 (a named rule)"
        return None

    def wrong(self, config):
        return config["X"] == 3

    def run(self, inputs, config=None, out=None):
        if config["X"] == 2:
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().run(inputs, config, out)

    def recorded_time_us(self, config, shape):
        return self.TIMES[config["X"]] * (1 + 0.01 * shape["batch"])

    def cost(self, shape, dtype="bfloat16"):
        return Cost(1e6, 1e6)

    def shapes(self, preset="v4flash"):
        return [{"batch": b, "width": 8} for b in (1, 2)]


TinyKernel.instance = TinyKernel()


class TwinKernel(_Identity):
    """``X`` in 1..4 sets the time (X=3 the fastest); ``ORDER`` in {1, 2} changes nothing when the shape has one row
    block (``rows == 1``), and its ``canonical_config`` says so."""

    name = "twin"
    batch_dim = "batch"
    TIMES = {1: 100.0, 2: 80.0, 3: 40.0, 4: 70.0}

    def default_config(self, shape):
        return {"X": 1, "ORDER": 2}

    def config_space(self, shape):
        return {"X": [1, 2, 3, 4], "ORDER": [1, 2]}

    def canonical_config(self, config, shape):
        return {**config, "ORDER": 1} if shape["rows"] == 1 else config

    def recorded_time_us(self, config, shape):
        return self.TIMES[config["X"]]

    def cost(self, shape, dtype="bfloat16"):
        return Cost(1e6, 1e6)

    def shapes(self, preset="v4flash"):
        return [{"batch": 1, "rows": 1}]


TwinKernel.instance = TwinKernel()


class ReplayKernel(_Identity):
    """The recorded H200 sweep behind the real sparse_decode contract (same name, so files are what it loads)."""

    name = "sparse_decode"
    batch_dim = "batch"
    _real = SparseDecodeKernel()

    def __init__(self) -> None:
        data = json.loads(TABLE.read_text())
        self.columns = data["columns"][:5]
        self.rows = {tuple(r[:5]): r for r in data["rows"]}
        ok = [r for r in data["rows"] if r[6] == "ok"]
        self.best = tuple(min(ok, key=lambda r: r[5])[:5])

    def default_config(self, shape):
        return self._real.default_config(shape)

    def config_space(self, shape):
        return {c: sorted({k[i] for k in self.rows}) for i, c in enumerate(self.columns)}

    def seed_configs(self, shape, device=None, dtype=None):
        return [
            c for c in self._real.seed_configs(shape, None, dtype) if tuple(c[k] for k in self.columns) in self.rows
        ]

    def key_dims(self, shape):
        return self._real.key_dims(shape)

    def check_config(self, config, shape, device=None, dtype=None):
        why = super().check_config(config, shape, device) or self._real.check_config(config, shape, device, dtype)
        if why:
            return why
        if self._key(config) not in self.rows:
            return "not_recorded: this config is not in the recorded sweep"
        return None

    def _key(self, config):
        return tuple(config[c] for c in self.columns)

    def wrong(self, config):
        return self._key(config) == self.best

    def run(self, inputs, config=None, out=None):
        row = self.rows[self._key(config)]
        if row[6] != "ok":
            raise OutOfResources(200_000, 232_448, "shared memory")
        return super().run(inputs, config, out)

    def recorded_time_us(self, config, shape):
        return float(self.rows[self._key(config)][5])

    def cost(self, shape, dtype="bfloat16"):
        return self._real.cost(shape, dtype)

    def shapes(self, preset="v4flash"):
        return [s for s in self._real.shapes("v4flash") if s["batch"] == 16]


ReplayKernel.instance = ReplayKernel()
