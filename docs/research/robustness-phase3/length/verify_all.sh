#!/usr/bin/env bash
# `sleuthd-bench robustness verify` (server defaults: length matching on) on every eval condition, against the
# session-27 replays through a real server: runs/replay-length (all 25, a server before the guard was added), and for
# the five conditions with a turn under half its speaker's median speech, runs/replay-length-guard (the served rule).
set -euo pipefail
export PYTHONPATH=$PWD/service:$PWD/tools:$PWD
GUARDED=" c-mixed f-fsdd-short g-kokoro-short b-espeak-expressive f-fsdd "
echo "# sleuthd-bench robustness verify <replay> --condition <c> (server defaults), every eval condition"
for m in data/robustness/eval-*.jsonl; do
  c=$(basename "$m" .jsonl); c=${c#eval-}
  dir=runs/replay-length
  [[ "$GUARDED" == *" $c "* ]] && dir=runs/replay-length-guard
  [[ "$c" == c-long-* ]] && dir=runs/replay-long  # session 28's long conditions (../size/verify_long.txt)
  echo "== $c ($dir/eval-$c)"
  .venv/bin/sleuthd-bench robustness verify "$dir/eval-$c" --condition "$c" 2>/dev/null | grep -E "refused|^auto"
done
