#!/bin/bash
# Issue 53's stress: N fresh-clone CI runs of one commit, one after the other, each beside two busy loops (one per
# core). Started from this script, .ci/run and everything it starts ignore SIGINT, as under a CI harness (the start
# that made Dagster's log mirrors ignore SIGTERM). Usage, from the repository:
#   bash benchmarks/ci_beside_busy_loops.sh "$(git rev-parse HEAD)" 5 /tmp/stress
# Each run's output: OUT/runI.log; one line per run: OUT/summary.txt.
set -u
COMMIT=$1
N=$2
OUT=${3:-/tmp/stress}
REPO=$(git rev-parse --show-toplevel)
mkdir -p "$OUT"
for i in $(seq 1 "$N"); do
  rm -rf "$OUT/clone"
  git clone -q "$REPO" "$OUT/clone" && git -C "$OUT/clone" checkout -q "$COMMIT"
  python3 -c "while True: pass" &
  L1=$!
  python3 -c "while True: pass" &
  L2=$!
  start=$(date +%s)
  (cd "$OUT/clone" && CI=true bash .ci/run >"$OUT/run$i.log" 2>&1; echo "rc=$?" >>"$OUT/run$i.log") &
  wait $!
  end=$(date +%s)
  kill $L1 $L2
  tiers=$(grep 'CI: uv run pytest' "$OUT/run$i.log" | tr '\n' ' ')
  echo "run $i $COMMIT: $(tail -1 "$OUT/run$i.log"), $((end - start)) s in all; $tiers" >>"$OUT/summary.txt"
  left=$(pgrep -c -f "tail -F -c" || true)
  [ "$left" != "0" ] && echo "run $i: $left tail processes left" >>"$OUT/summary.txt"
done
