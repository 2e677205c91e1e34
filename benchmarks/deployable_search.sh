#!/usr/bin/env bash
# Issue 42 on a GPU: a 7-minute workload search (the built-in dsv4_flash space), with or without
# `--set deployable_only=true`, then its export's two predictions re-measured (`tuner verify launch.sh` runs
# remeasure.sh, the twin's best, and remeasure_command.sh, the exported command's configuration) and `tuner explain`'s
# command-vs-best table. Everything lands in $OUT/<mode>/ (the study's database, the export, verify's and explain's
# output); `python benchmarks/deployable_report.py $OUT/off $OUT/on` writes the markdown for benchmarks/results/.
#   bash benchmarks/deployable_search.sh off|on [budget]      (one device command each: ~7 + 2 minutes)
set -euo pipefail
MODE="${1:?off or on}"; BUDGET="${2:-7m}"; OUT="${OUT:-out}"
DEST="$OUT/$MODE"; mkdir -p "$DEST"
SETS=(); [ "$MODE" = on ] && SETS=(--set deployable_only=true)
STUDY="dsv4-deployable-$MODE"; DB="sqlite:///$DEST/tuner.db"
python3 -m tuner search --budget "$BUDGET" --study "$STUDY" --storage "$DB" --seed 0 -o "$DEST/export" "${SETS[@]}" \
    2>&1 | tee "$DEST/search.log"
python3 -m tuner verify "$DEST/export/$STUDY/launch.sh" --tolerance 0.5 > "$DEST/verify.txt" 2>&1 || true
python3 -m tuner explain --study "$STUDY" --storage "$DB" --no-profile -o "$DEST/explain.md" > /dev/null 2>&1 || true
cat "$DEST/verify.txt"
