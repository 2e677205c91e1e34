"""Run as a subprocess by test_kernels_compile_only.py (never under TRITON_INTERPRET): compile kernel configs for
sm_90 with the real Triton compiler on a machine without a GPU.

Triton asks its active driver for the target, device and stream; here a driver that answers sm_90 stands in for
the CUDA one (nothing is launched: every launch goes through ``jit_compile_only``). ``meta`` compiles from meta
tensors, as the compile helpers do; ``real`` from real CPU tensors, as a trial's first launch specialises them.

    python compile_probe.py meta|real KERNEL[,KERNEL...]
    python compile_probe.py launches KERNEL    (the keyword arguments of every launch, from meta tensors: the
                                               default config, then the first config of the space that splits)
    python compile_probe.py loads KERNEL DTYPE SHAPE_JSON [CONFIG_JSON]
                                              (how each launched Triton kernel reads global memory, counted in its
                                               sm_90 PTX: plain loads by width, async copies by bytes; from meta
                                               tensors of the inputs the kernel makes for that shape)
    python compile_probe.py tldot SHAPE_JSON CONFIG_JSON [KWARGS_JSON]
                                              (the tl.dot sparse decode's sm_90 build: its split kernel's
                                               launch_dependents count, the merge's PDL launch)
    python compile_probe.py wgmma SHAPE_JSON CONFIG_JSON [KWARGS_JSON]
                                              (the Gluon sparse-decode kernel's sm_90 build: instruction counts
                                               in its PTX; registers and local memory by cuobjdump; KWARGS: more
                                               keyword arguments of the launch, such as pdl; kv_fp8: an fp8
                                               cache with row scales)
"""

import json
import re
import sys
import time

from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.driver import CudaDriver
from triton.runtime import driver


class Sm90(CudaDriver):
    def __init__(self):  # no CUDA library is loaded
        pass

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def set_current_device(self, device):
        pass


def configs(kernel, shape):
    """The default and the first other config of the space that passes the kernel's rules."""
    default = kernel.default_config(shape)
    other = next((c for c in kernel.configs(shape, None, "float16") if {**default, **c} != default), None)
    return [default] + ([{**default, **other}] if other else [])


def _keep_builds() -> dict:
    """From now on every Triton launch's compiled kernel is kept here, by its function's name."""
    from triton.runtime.jit import JITFunction

    builds: dict = {}
    original = JITFunction.run

    def keep(self, *args, **kwargs):
        compiled = original(self, *args, **kwargs)
        builds[self.fn.__name__] = compiled
        return compiled

    JITFunction.run = keep
    return builds


def wgmma_build(shape: dict, config: dict, kwargs: dict | None = None) -> dict:
    """Compile ``kernels.sparse_decode_wgmma`` for ``shape`` (bf16, meta tensors) and read its split kernel's PTX."""
    import os
    import subprocess
    import tempfile

    import torch
    import triton

    from kernels.compile_only import jit_compile_only
    from kernels.sparse_decode_wgmma import sparse_decode_wgmma

    builds = _keep_builds()
    kwargs = dict(kwargs or {})
    fp8 = kwargs.pop("kv_fp8", False)  # an fp8 cache with row scales
    q = torch.empty(shape["batch"], shape["heads"], shape["d_qk"], dtype=torch.bfloat16, device="meta")
    kv = torch.empty(
        shape["num_rows"], shape["d_qk"], dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16, device="meta"
    )
    if fp8:
        kwargs["kv_scale"] = torch.empty(shape["num_rows"], dtype=torch.float32, device="meta")
    idx = torch.empty(shape["batch"], shape["topk"], dtype=torch.int32, device="meta")
    with jit_compile_only():
        sparse_decode_wgmma(q, kv, idx, None, config, **kwargs)
    compiled = next(v for k, v in builds.items() if k.startswith("sparse_decode_wgmma"))  # plain or WS
    ptx = compiled.asm["ptx"]
    if os.environ.get("PROBE_PTX"):  # for reading by hand
        with open(os.environ["PROBE_PTX"], "w") as f:
            f.write(ptx)
    counts = {
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "mma.sync": len(re.findall(r"\bmma\.sync", ptx)),
        "ld.global.v4": len(re.findall(r"\bld\.global(?:\.\w+)*?\.v4\.", ptx)),
        "st.global.v4": len(re.findall(r"\bst\.global(?:\.\w+)*?\.v4\.", ptx)),
        "st.global.v2": len(re.findall(r"\bst\.global(?:\.\w+)*?\.v2\.", ptx)),
        "setmaxnreg": len(re.findall(r"\bsetmaxnreg\.", ptx)),
        "copy_arrive": len(re.findall(r"\bcp\.async\.mbarrier\.arrive", ptx)),
        "mbarrier.try_wait": len(re.findall(r"\bmbarrier\.try_wait", ptx)),
        "copy_wait_group": len(re.findall(r"\bcp\.async\.wait_group", ptx)),
        "atom.acq_rel.add": len(re.findall(r"\batom\.global\.gpu\.acq_rel\.add", ptx)),
        "ld.global.cg": len(re.findall(r"\bld\.global\.cg", ptx)),
        "griddepcontrol.launch_dependents": len(re.findall(r"\bgriddepcontrol\.launch_dependents", ptx)),
        "cvt.f16x2.e4m3x2": len(re.findall(r"\bcvt\.rn\.f16x2\.e4m3x2", ptx)),
        "cvt.f32.f16": len(re.findall(r"\bcvt\.f32\.f16\b", ptx)),
        "%clock64": ptx.count("%clock64"),
        "%globaltimer": ptx.count("%globaltimer"),
    }
    for m in re.finditer(r"cp\.async\.c[ag]\.shared\.global[^;]*?,\s*(0x[0-9a-f]+|\d+)", ptx):
        key = f"cp.async.{int(m.group(1), 0)}B"
        counts[key] = counts.get(key, 0) + 1
    counts.setdefault("cp.async.16B", 0)
    usage = None  # what the cubin's function uses, by cuobjdump (shipped with Triton's NVIDIA backend)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if os.path.exists(cuobjdump):
        with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
            f.write(compiled.asm["cubin"])
        r = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True)
        os.unlink(f.name)
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", r.stdout)
        if m:
            usage = {"registers": int(m.group(1)), "stack": int(m.group(2)), "local": int(m.group(3))}
    merge = builds.get("combine_kernel")  # launched after the split kernel unless one split writes the output
    return {
        "ptx": counts,
        "usage": usage,
        "shared_bytes": compiled.metadata.shared,
        "merge_launch_pdl": None if merge is None else bool(merge.metadata.launch_pdl),
    }


def tldot_build(shape: dict, config: dict, kwargs: dict | None = None) -> dict:
    """Compile ``kernels.sparse_decode.sparse_decode`` (bf16, meta tensors) for ``shape``: its split kernel's
    ``griddepcontrol.launch_dependents`` count and whether the merge kernel is launched with PDL."""
    import torch

    from kernels.compile_only import jit_compile_only
    from kernels.sparse_decode import sparse_decode

    builds = _keep_builds()
    q = torch.empty(shape["batch"], shape["heads"], shape["d_qk"], dtype=torch.bfloat16, device="meta")
    kv = torch.empty(shape["num_rows"], shape["d_qk"], dtype=torch.bfloat16, device="meta")
    idx = torch.empty(shape["batch"], shape["topk"], dtype=torch.int32, device="meta")
    with jit_compile_only():
        sparse_decode(q, kv, idx, None, config, **(kwargs or {}))
    ptx = builds["_sparse_decode_kernel"].asm["ptx"]
    merge = builds.get("combine_kernel")
    return {
        "launch_dependents": len(re.findall(r"\bgriddepcontrol\.launch_dependents", ptx)),
        "merge_launch_pdl": None if merge is None else bool(merge.metadata.launch_pdl),
    }


def main() -> None:
    mode, names = sys.argv[1], sys.argv[2].split(",")
    driver.set_active(Sm90())
    if mode == "tldot":
        print(
            json.dumps(
                tldot_build(
                    json.loads(sys.argv[2]),
                    json.loads(sys.argv[3]),
                    json.loads(sys.argv[4]) if len(sys.argv) > 4 else None,
                )
            )
        )
        return
    from kernels.compile_only import compile_config, jit_compile_only, meta_inputs
    from kernels.registry import get_kernel

    out = {}
    if mode == "wgmma":
        print(
            json.dumps(
                wgmma_build(
                    json.loads(sys.argv[2]),
                    json.loads(sys.argv[3]),
                    json.loads(sys.argv[4]) if len(sys.argv) > 4 else None,
                )
            )
        )
        return
    if mode == "loads":
        from triton.runtime.jit import JITFunction

        kernel = get_kernel(names[0])
        shape = json.loads(sys.argv[4])
        config = {**kernel.default_config(shape), **(json.loads(sys.argv[5]) if len(sys.argv) > 5 else {})}
        inputs = meta_inputs(kernel.make_inputs(shape, sys.argv[3], "cpu", 0))
        original = JITFunction.run

        def count(self, *args, **kwargs):
            compiled = original(self, *args, **kwargs)
            ptx = compiled.asm["ptx"]
            kinds: dict[str, int] = {}
            for m in re.finditer(r"\bld\.global(?:\.\w+)*?\.(v[248]\.)?[bfsu](\d+)\b", ptx):
                key = f"ld.{m.group(1) or ''}b{m.group(2)}"
                kinds[key] = kinds.get(key, 0) + 1
            for m in re.finditer(r"cp\.async\.c[ag]\.shared\.global[^;]*?,\s*(0x[0-9a-f]+|\d+)", ptx):
                key = f"cp.async.{int(m.group(1), 0)}B"
                kinds[key] = kinds.get(key, 0) + 1
            out[self.fn.__name__] = kinds
            return compiled

        JITFunction.run = count
        compile_config(kernel, inputs, config)
        print(json.dumps(out))
        return
    if mode == "launches":  # what each Triton launch of the default config is given (constexprs, options)
        from triton.runtime.jit import JITFunction

        kernel = get_kernel(names[0])
        shape = kernel.shapes("test")[0]
        inputs = meta_inputs(kernel.make_inputs(shape, "float16", "cpu", 0))
        original = JITFunction.run

        def record(self, *args, **kwargs):
            out.setdefault(self.fn.__name__, []).append(
                {k: v for k, v in kwargs.items() if isinstance(v, (bool, int, str)) and k != "warmup"}
            )
            return original(self, *args, **kwargs)

        JITFunction.run = record
        default = kernel.default_config(shape)
        compile_config(kernel, inputs, default)
        split = next((c for c in kernel.configs(shape, None, "float16") if c.get("S", 1) > 1), None)
        if split is not None:
            compile_config(kernel, inputs, {**default, **split})
        print(json.dumps(out))
        return
    for name in names:
        kernel = get_kernel(name)
        shape = kernel.shapes("test")[0]
        inputs = kernel.make_inputs(shape, "float16", "cpu", 0)
        for cfg in configs(kernel, shape):
            t0 = time.perf_counter()
            if mode == "meta":
                compile_config(kernel, meta_inputs(inputs), cfg)
            else:
                o = kernel.output_like(inputs)
                with jit_compile_only():
                    kernel.run(inputs, cfg) if o is None else kernel.run(inputs, cfg, out=o)
            out.setdefault(name, []).append(time.perf_counter() - t0)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
