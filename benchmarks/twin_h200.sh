#!/usr/bin/env bash
# The twin on one H200, from scratch: a workload search, then its best side by side with the hand-written best.
# Device calls (each must end within 10 minutes), run from the repository root:
#   bash benchmarks/twin_h200.sh search        # tuner search --budget 9m on the default GPU space (dsv4_flash)
#   bash benchmarks/twin_h200.sh resume        # tuner search --resume --budget $BUDGET: the same study, more time
#   bash benchmarks/twin_h200.sh side-by-side  # benchmarks/workload_gpu.py --only-ends --study-best <the study>
# A search longer than one call runs as `search` then `resume` (BUDGET=5m each: a 10-minute search in two halves; the
# second half's TPE starts from every stored trial). Between two machines, carry the database ($DB, ignored by git).
# Each copies what it made into $OUT (the study database, the export, the side-by-side table). Then, on a host
# with SGLang 0.5.23 installed (no GPU needed), write the report, which also checks the exported command with
# SGLang's own parser:
#   python benchmarks/twin_report.py --db twin19_h200.db --study twin19-h200 \
#       --side-by-side benchmarks/results/workload/h200/2026-11-30_4fdb1ff_twin19.md --out benchmarks/results/twin_report/h200/2026-11-30_0819ad9_twin19.md
set -euo pipefail
DB=${DB:-twin19_h200.db}     # ignored by git: kept on a warm device machine between calls, or carried
STUDY=${STUDY:-twin19-h200}
OUT_DIR=${OUT:-/tmp/twin19-out}
BUDGET=${BUDGET:-9m}
mkdir -p "$OUT_DIR"
export TUNER_COMMIT=${TUNER_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
case "${1:-}" in
  search)
    rm -f "$DB"
    python -m tuner search --budget "$BUDGET" --storage "sqlite:///$DB" --study "$STUDY" -o tuner-out
    python -m tuner status --storage "sqlite:///$DB" --study "$STUDY" > "$OUT_DIR/status.txt" || true
    cp "$DB" "$OUT_DIR/"
    cp "tuner-out/$STUDY/launch.sh" "$OUT_DIR/launch.sh"
    cp "tuner-out/$STUDY/remeasure.sh" "$OUT_DIR/remeasure.sh"
    ;;
  resume)
    python -m tuner search --resume --budget "$BUDGET" --storage "sqlite:///$DB" --study "$STUDY" -o tuner-out
    python -m tuner status --storage "sqlite:///$DB" --study "$STUDY" > "$OUT_DIR/status.txt" || true
    cp "$DB" "$OUT_DIR/"
    cp "tuner-out/$STUDY/launch.sh" "$OUT_DIR/launch.sh"
    cp "tuner-out/$STUDY/remeasure.sh" "$OUT_DIR/remeasure.sh"
    ;;
  side-by-side)
    python benchmarks/workload_gpu.py --only-ends --study-best "sqlite:///$DB#$STUDY" \
        --out "$OUT_DIR/workload_$STUDY.md"
    cp "$DB" "$OUT_DIR/"
    ;;
  *)
    echo "usage: bash benchmarks/twin_h200.sh search|resume|side-by-side" >&2
    exit 2
    ;;
esac
