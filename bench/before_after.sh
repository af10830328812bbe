#!/bin/bash
# The zoo under two versions of tilefuse in one device call, one after the other (each installed in turn, its own
# empty tuning database), Inductor default beside each: no benchmark number may get worse across a change.
#   make the two copies here:  git archive <before-commit> | tar -x -C .snap_before ; git archive HEAD | tar -x -C .snap
#   then on the device (carry .devcache .snap .snap_before):
#   bash .snap/bench/before_after.sh .snap_before .snap gpt2,bert TAG     (ORDER="after before" swaps the order)
# Writes $OUT/TAG_before.json, $OUT/TAG_after.json (+ .log) and each run's tuning database ($OUT/TAG_db_*.json).
set -u
BEFORE=$1; AFTER=$2; MODELS=$3; TAG=$4
for v in ${ORDER:-before after}; do
  d=$AFTER; [ "$v" = before ] && d=$BEFORE
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e "$d" >/dev/null 2>&1
  (cd "$d" && TILEFUSE_TUNING_DB=/tmp/${TAG}_db_$v.json TILEFUSE_QUIET=1 python bench/bench_models.py --models "$MODELS" \
     --peers default --no-profile --no-warm --reps 20 --json "$OUT/${TAG}_$v.json" 2>&1 \
     | grep -v "^DEBUG\|Warning\|warn" | tail -14 > "$OUT/${TAG}_$v.log")
  echo "== $v"; cat "$OUT/${TAG}_$v.log"
  cp "/tmp/${TAG}_db_$v.json" "$OUT/${TAG}_db_$v.json" 2>/dev/null
done
