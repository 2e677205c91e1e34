"""The TunableKernel contract helpers: failure classes, error measure, poisoning, registry, imports."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from triton.runtime.errors import OutOfResources

from kernels import KERNELS, InvalidConfig, WrongResult, check, classify_failure, get_kernel
from kernels.base import Cost, rel_error

RUNNABLE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(not RUNNABLE, reason="no CUDA and Triton was imported before TRITON_INTERPRET=1")


def test_failure_classes():
    assert classify_failure(OutOfResources(300000, 232448, "shared memory")) == "out_of_resources"
    assert classify_failure(InvalidConfig("x")) == "invalid_config"
    assert classify_failure(WrongResult("x")) == "wrong_result"
    assert classify_failure(RuntimeError("boom")) == "crash"
    assert issubclass(InvalidConfig, ValueError)


def test_rel_error_catches_nan_and_moved_infinities():
    ref = torch.tensor([1.0, float("-inf"), 2.0])
    assert rel_error(ref.clone(), ref) == 0.0
    assert rel_error(torch.tensor([1.0, float("nan"), 2.0]), ref) == math.inf
    assert rel_error(torch.tensor([1.0, 0.0, 2.0]), ref) == math.inf
    assert rel_error(torch.zeros(2), ref) == math.inf
    assert rel_error(torch.tensor([1.0, float("inf"), 2.0]), ref) == math.inf  # the sign of a masked score
    assert rel_error(torch.tensor([1.0, float("-inf"), 2.5]), ref) == pytest.approx(0.5 / math.sqrt(5.0))


def test_rel_error_is_the_float64_relative_norm_error_computed_where_the_tensors_are(monkeypatch):
    """On fresh random bf16 outputs against a float32 reference: the float64 relative norm error of the finite
    entries, to 1e-12. And it never copies the tensors to the host (a kernel trial's check of a batch-64 sparse
    decode output on a GPU host spent about 0.3 s there): no ``Tensor.cpu``, and no ``Tensor.to`` another device
    than the tensor's own."""
    g = torch.Generator().manual_seed(7)
    ref = torch.randn(64, 64, 512, generator=g)
    ref[3, :, 5] = float("-inf")
    out = (ref + 1e-3 * torch.randn(ref.shape, generator=g)).to(torch.bfloat16)
    finite = ~torch.isinf(ref)
    expect = ((out.double() - ref.double())[finite].norm() / ref.double()[finite].norm()).item()
    real_to = torch.Tensor.to

    def no_host_copy(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, (str, torch.device)) and torch.device(target) != self.device:
            raise AssertionError(f"rel_error copied a tensor from {self.device} to {target}")
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(
        torch.Tensor,
        "cpu",
        lambda self, *a, **k: (_ for _ in ()).throw(AssertionError("rel_error copied a tensor to the host")),
    )
    monkeypatch.setattr(torch.Tensor, "to", no_host_copy)
    assert rel_error(out, ref) == pytest.approx(expect, rel=1e-12, abs=0)


@needs_triton
def test_a_kernel_that_writes_nothing_fails():
    class Lazy(type(get_kernel("rmsnorm"))):
        def run(self, inputs, config=None, out=None):
            return torch.cat([out.flatten(), out.flatten()])  # the poisoned buffer, untouched

    assert check(Lazy(), {"tokens": 2, "hidden": 64}, "float32", None, "cpu") == math.inf


def test_registry_resolves_every_kernel():
    for name in KERNELS:
        assert get_kernel(name).name == name
    with pytest.raises(ValueError, match="unknown kernel"):
        get_kernel("nope")


def test_cost_floor():
    c = Cost(bytes=4.27e6, flops=1e9)
    assert c.floor_us(4.27e12, 1e15) == pytest.approx(1.0)
    assert c.bound(4.27e12, 1e15) == "memory"


def test_kernels_package_imports_none_of_the_project():
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys; import kernels, kernels.sparse_decode, kernels.indexer, kernels.gemm, kernels.glue, "
        "kernels.configs, kernels.bench; bad = [m for m in sys.modules if m.split('.')[0] in "
        "('tuner', 'storage', 'api', 'search_spaces')]; assert not bad, bad"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        check=True,
        env={"PYTHONPATH": str(root), "TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"},
    )


@needs_triton
def test_selfcheck_runs_every_kernel(capsys):
    from kernels import selfcheck

    dev = ["--device", "cuda"] if torch.cuda.is_available() else []
    assert selfcheck.main(["--preset", "test", "--dtype", "float32", "--max-shapes", "1", *dev]) == 0
    from kernels.registry import get_kernel

    runs_fp32 = [n for n in KERNELS if not get_kernel(n).dtypes or "float32" in get_kernel(n).dtypes]
    assert len(runs_fp32) >= 7  # every kernel of kernels/ (the SGLang plug-in runs bf16/fp16 only)
    assert f"{len(runs_fp32)}/{len(runs_fp32)} ok" in capsys.readouterr().out


@needs_triton
def test_every_launcher_uses_the_one_config_cache_and_clear_cache_empties_it():
    from kernels import configs
    from kernels.gemm import gemm
    from kernels.glue import fused_add_rmsnorm

    configs.clear_cache()
    x, w = torch.randn(2, 32), torch.randn(16, 32)
    if torch.cuda.is_available():
        x, w = x.cuda(), w.cuda()
    gemm(x, w, "fp32")
    fused_add_rmsnorm(x, torch.zeros_like(x), torch.ones(32, device=x.device))
    assert {k[0] for k in configs._LAUNCH} == {"gemm", "rmsnorm"}
    configs.clear_cache()
    assert not configs._LAUNCH


def test_cdiv_is_the_ceil_division_of_host_ints_that_the_kernels_launch_with():
    """kernels.base.cdiv replaces triton.cdiv in host code (a ConstexprFunction there, ~8 µs a call): the same
    values as Triton's own for every pair it is asked in a sweep of small sizes, zero included."""
    import triton

    from kernels.base import cdiv

    for a in range(0, 130):
        for b in (1, 2, 3, 16, 64, 128):
            assert cdiv(a, b) == triton.cdiv(a, b) == math.ceil(a / b), (a, b)
