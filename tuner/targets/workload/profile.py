"""Op-level profile of one decode step (torch profiler): top kernels by device time, share, launch count; the
share of each stage of the step (``stage::`` ranges of the model: glue, mhc, attention, indexer, moe); and on a GPU
the torch ops, with their input shapes, whose own kernels took the most time. On a GPU a stage counts the kernels
the profiler links to a torch op inside it; Triton's own launches are not linked (torch 2.11), so the stages of a
configuration that runs Triton kernels hold less than the whole step (measured on an H200: 97% of the default's
step, 42% of the hand-written best's).

``python -m tuner.targets.workload.profile --preset P --level 64 --knob k=v ... --json`` prints one JSON object; it is
what ``tuner explain`` runs (in a subprocess) for the baseline and the best configuration.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict


def device_time(event, name: str) -> float:
    """An event's ``device_time_total``-style field, or its older ``cuda_*`` name (torch < 2.4); 0 when it has
    neither. A stage whose kernels are all Triton launches (not linked to a torch op) reads 0, which is data."""
    value = getattr(event, name, None)
    if value is None:
        value = getattr(event, name.replace("device", "cuda"), None)
    return float(value or 0.0)


def profile_step(model, batch: int, live_context: int, top: int = 12, buckets: str | None = None) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    st = model.state(batch, live_context)
    cuda = model.device.type == "cuda"
    with torch.inference_mode():
        for _ in range(2):
            model.step(st)
        if cuda:
            torch.cuda.synchronize()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        model.profiling = True
        try:
            with profile(activities=acts, record_shapes=True) as prof:
                model.step(st)
                if cuda:
                    torch.cuda.synchronize()
        finally:
            model.profiling = False
    events = prof.key_averages(group_by_input_shape=True)
    stages: dict[str, float] = defaultdict(float)
    shaped = []  # the torch ops with their input shapes, by the device time of the kernels they launch themselves
    rows = []
    total = 0.0
    for e in events:
        device_type = getattr(e, "device_type", None)
        cpu_side = device_type is not None and str(device_type).endswith("CPU")
        if e.key.startswith("stage::"):
            # the CPU-side range, whose device time is that of the kernels launched inside it (the GPU-side copy of
            # the range spans first to last kernel, idle gaps included, and would count the stage twice)
            if device_type is None or cpu_side:
                stages[e.key.split("::", 1)[1]] += device_time(e, "device_time_total") if cuda else e.cpu_time_total
            continue
        if cuda and cpu_side:  # a torch op: its kernels are counted as the GPU-side events
            if e.input_shapes and (getattr(e, "self_device_time_total", None) or 0) > 0:
                shaped.append(
                    {
                        "op": e.key,
                        "time_us": e.self_device_time_total,
                        "count": e.count,
                        "shapes": str(e.input_shapes)[:160],
                    }
                )
            continue
        if not cuda and e.key.startswith("ProfilerStep"):
            continue
        t = device_time(e, "self_device_time_total") if cuda else e.self_cpu_time_total
        total += t
        rows.append(
            {"op": e.key, "time_us": t, "count": e.count, "shapes": str(e.input_shapes)[:160] if e.input_shapes else ""}
        )
    if "attention" in stages:  # the indexer runs inside the attention stage: report the two apart
        stages["attention"] -= stages.get("indexer", 0.0)
    by_op: dict[str, dict] = defaultdict(lambda: {"time_us": 0.0, "count": 0, "shapes": ""})
    for r in rows:
        agg = by_op[r["op"]]
        if r["time_us"] > agg.get("_best", -1):
            agg["shapes"], agg["_best"] = r["shapes"], r["time_us"]
        agg["time_us"] += r["time_us"]
        agg["count"] += r["count"]
    ops = sorted(
        ({"op": k, **{kk: vv for kk, vv in v.items() if kk != "_best"}} for k, v in by_op.items()),
        key=lambda r: -r["time_us"],
    )
    for r in ops:
        r["share"] = r["time_us"] / total if total else 0.0
    launches = sum(r["count"] for r in ops) if cuda else sum(r["count"] for r in rows)
    # on a CPU a stage's range also holds the Python between its ops, which the op total leaves out: the stages'
    # own sum is then the whole
    whole = total if cuda else max(total, sum(stages.values()))
    by_stage = [
        {"stage": k, "time_us": v, "share": v / whole if whole else 0.0}
        for k, v in sorted(stages.items(), key=lambda kv: -kv[1])
    ]
    return {
        "device": "cuda" if cuda else "cpu",
        "batch": batch,
        "total_us": total,
        "launches": launches,
        "top": ops[:top],
        "stages": by_stage,
        "shaped": sorted(shaped, key=lambda r: -r["time_us"])[: max(1, top // 2)],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner.targets.workload.profile")
    ap.add_argument("--preset", default="dsv4-flash")
    ap.add_argument("--level", type=int, default=64)
    ap.add_argument("--live-context", type=int, default=512)
    ap.add_argument("--knob", action="append", default=[])
    args = ap.parse_args(argv)
    import torch

    from tuner.targets.workload.model import DecodeModel
    from tuner.targets.workload.presets import get_preset
    from tuner.targets.workload.run import _value

    knobs = {k: _value(v) for k, _, v in (item.partition("=") for item in args.knob)}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = DecodeModel(get_preset(args.preset), knobs, device)
    print(json.dumps(profile_step(model, args.level, args.live_context)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
