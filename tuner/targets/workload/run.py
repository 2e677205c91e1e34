"""``python -m tuner.targets.workload.run``: run the decode workload with given knobs and print tok/s per level.

This is what an exported launch script of the workload target runs (it re-measures the configuration). With
``--sglang-plugin DIR`` (or ``TUNER_SGLANG_PLUGIN=DIR``, as an export's remeasure_plugin.sh sets it) the exported SGLang
plug-in in ``DIR`` is loaded first, as SGLang loads it (:mod:`tuner.targets.workload.sglang_plugin`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tuner.targets.base import SGLANG_PLUGIN_ENV as PLUGIN_ENV
from tuner.targets.workload.presets import PRESETS


def _value(raw: str):
    for conv in (int, float):
        try:
            return conv(raw)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(raw.lower(), raw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner.targets.workload.run", description=__doc__)
    ap.add_argument("--preset", default="dsv4-flash", choices=sorted(PRESETS))
    ap.add_argument("--levels", default="1,16,64")
    ap.add_argument("--live-context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--knob", action="append", default=[], help="name=value, repeatable")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument(
        "--sglang-plugin",
        metavar="DIR",
        default=os.environ.get(PLUGIN_ENV) or None,
        help="load this exported SGLang plug-in (an export's sglang_plugin/) before building the step",
    )
    args = ap.parse_args(argv)
    import torch

    from tuner.errors import KnobError
    from tuner.targets.workload.bench import measure
    from tuner.targets.workload.model import DecodeModel
    from tuner.targets.workload.presets import get_preset

    knobs = {}
    for item in args.knob:
        if "=" not in item:
            print(f"error: --knob {item!r} must be name=value", file=sys.stderr)
            return 2
        k, _, v = item.partition("=")
        knobs[k] = _value(v)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        if args.sglang_plugin:
            from tuner.targets.workload.sglang_plugin import load_sglang_plugin

            hooked = load_sglang_plugin(args.sglang_plugin)
            print(f"SGLang plug-in {args.sglang_plugin}: {', '.join(hooked) or 'no hook'}", file=sys.stderr)
        model = DecodeModel(get_preset(args.preset), knobs, device)
        levels = [int(x) for x in args.levels.split(",")]
    except (KnobError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    res = measure(
        model, levels, live_context=args.live_context, repeats=args.repeats, buckets=knobs.get("cuda_graph_buckets")
    )
    if args.json:
        print(json.dumps({f"c={lv.concurrency}": lv.tok_s for lv in res.levels}))
    else:
        for lv in res.levels:
            print(
                f"c={lv.concurrency:<4d} {lv.tok_s:12.1f} tok/s  step {lv.step_s * 1e3:9.3f} ms"
                f"  {'graph' if lv.graphed else 'eager'} batch {lv.batch}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
