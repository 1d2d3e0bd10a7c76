#!/usr/bin/env bash
# The served default (pitch matching at 0.25) through a real server: every eval condition of the matrix and the dev
# benchmark's three splits, replayed with `sleuthd-bench replay`; one line per manifest in $OUT/summary.txt.
#   bash docs/research/robustness-phase3/resample/replay_default.sh [OUT]   (~25 min on 2 cores)
# MANIFESTS="a.jsonl b.jsonl" replays those instead; SERVER_ARGS="--pitch-match-octaves 0" serves other settings.
set -euo pipefail
OUT=${1:-runs/default-replay}
export PYTHONPATH=$PWD/service:$PWD/tools:$PWD
mkdir -p "$OUT"
PORT=50781
.venv/bin/sleuthd serve --port $PORT --metrics-port -1 --encoder fused ${SERVER_ARGS:-} > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 60); do grep -q "listening" "$OUT/server.log" && break; sleep 1; done
[ -n "${MANIFESTS:-}" ] || : > "$OUT/summary.txt"
for m in ${MANIFESTS:-data/robustness/eval-*.jsonl data/devlarge/eval-dev-*.jsonl}; do
  name=$(basename "$m" .jsonl)
  .venv/bin/sleuthd-bench replay "$m" --target 127.0.0.1:$PORT --encoder fused --methods auto --thresholds default \
    --out "$OUT/$name" > "$OUT/$name.log" 2>&1 || echo "$name: replay exited $? (see $name.log)" >> "$OUT/summary.txt"
  echo "$name $(grep -m1 -E '^\| auto \|' "$OUT/$name/report.md")" | tee -a "$OUT/summary.txt"
done
