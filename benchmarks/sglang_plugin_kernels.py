"""Side by side: the SGLang plug-in's kernels beside the SGLang functions they would replace, on SGLang's arguments.

The measurement is the product's (``tuner.export.sglang_plugin_measure``, which the search runs after its trials);
this script runs it on its own and files it.

For now one replacement: ``sglang.kernels.ops.attention.dsv4.norm_rope.fused_q_norm_rope`` (V4's decode q path:
RMSNorm of each head without weight, interleaved rope on the last 64 dims) against ``kernels/sglang_q_norm_rope.py``.
Per batch (1/16/64 by default), on a GPU:

1. builds SGLang's own kernel (its JIT needs ``apache-tvm-ffi``); where it cannot, says so once and times ours beside
   a torch implementation of the same semantics instead, every record labelled ``baseline: torch`` (such a record
   never ships in a plug-in);
2. checks ours against SGLang's output (relative norm error) for each config of a small sweep, keeps the fastest
   correct one, captures it in a CUDA graph and checks the replay against eager;
3. times both with ``triton.testing.do_bench`` (median), and writes the records (``tuner.export.sglang_plugin
   .SideBySide``) as JSON: ``$OUT/sglang_plugin_kernels.json`` (``--out``), with a short report beside it.

``--store STUDY --storage URL [--from FILE]`` stores the records of a run (this one, or a JSON written earlier) into
a study, where ``tuner export`` reads them (no GPU needed for that step).

    OUT=/tmp/out TUNER_COMMIT=$(git rev-parse --short HEAD) python benchmarks/sglang_plugin_kernels.py
    python benchmarks/sglang_plugin_kernels.py --store STUDY --storage sqlite:///tuner.db --from out/sglang_plugin_kernels.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() not in (ROOT, Path(__file__).resolve().parent)
]


def _commit() -> str:
    from benchmarks.common import short_commit

    return short_commit()


def store(study: str, url: str, path: Path) -> int:
    from storage import Repo
    from tuner.export.sglang_plugin import SideBySide, store_records

    doc = json.loads(path.read_text())
    records = [SideBySide.from_dict(dict(r, source=r.get("source") or str(path))) for r in doc["records"]]
    store_records(Repo(url), study, records, path.stem + "-" + (records[0].date if records else "empty"))
    print(f"stored {len(records)} side-by-side record(s) from {path} into study {study!r}")
    return 0


def main(argv=None) -> int:
    from tuner.export.sglang_plugin_measure import case_of, parser

    ap = parser()
    ap.description = __doc__.split("\n\n")[0]
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results/gpu-run")))
    ap.add_argument("--store", metavar="STUDY")
    ap.add_argument("--storage", metavar="URL")
    ap.add_argument("--from", dest="from_json", type=Path, help="store the records of this JSON (no GPU needed)")
    args = ap.parse_args(argv)
    if not args.commit:
        args.commit = os.environ.get("KERNELS_GIT_COMMIT") or _commit()
    if args.store and not args.storage:
        print("error: --store needs --storage URL (the study's database, e.g. sqlite:///tuner.db)", file=sys.stderr)
        return 2
    if args.from_json:
        if not args.store:
            print("error: --from FILE only stores records: give --store STUDY --storage URL", file=sys.stderr)
            return 2
        return store(args.store, args.storage, args.from_json)
    import torch

    if not torch.cuda.is_available():
        print(
            "error: no CUDA device: this benchmark times GPU kernels; run it on the H200 "
            "(or store an earlier run with --from FILE)",
            file=sys.stderr,
        )
        return 2
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    from tuner.export.sglang_plugin_measure import measure

    records = measure(case_of(args), say)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sglang_plugin_kernels.json"
    for r in records:
        r["source"] = path.name
    path.write_text(json.dumps({"records": records}, indent=1) + "\n")
    head = (
        f"# SGLang plug-in kernels beside SGLang's own ({records[0]['gpu']}, {records[0]['date']} UTC, commit "
        f"{records[0]['commit']}, SGLang {records[0]['sglang']}; benchmarks/sglang_plugin_kernels.py)"
        if records
        else "# SGLang plug-in kernels beside SGLang's own: no record"
    )
    (args.out / "sglang_plugin_kernels.md").write_text(
        "\n".join([head, "", *lines, "", f"records: {path.name}"]) + "\n"
    )
    print(f"wrote {path}")
    if args.store:
        return store(args.store, args.storage, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
