#!/usr/bin/env bash
# Start a server on a free loopback port, check one dialogue file against it, stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
dialogue="$1"; shift || true
log=$(mktemp)
.venv/bin/sleuthd --log-level warning serve --host 127.0.0.1 --port 0 --metrics-port -1 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 120); do
  grep -q "listening on" "$log" && break
  kill -0 $pid 2>/dev/null || { cat "$log"; echo "server failed to start" >&2; exit 1; }
  sleep 0.5
done
target=$(sed -n 's/^sleuthd listening on \(.*\)$/\1/p' "$log" | head -1)
[ -n "$target" ] || { cat "$log"; echo "server did not report its port" >&2; exit 1; }
echo "server listening on $target"
set +e
.venv/bin/sleuthd check "$dialogue" --target "$target" "$@"
rc=$?
set -e
# exit 3 means "a speaker is inconsistent": the demo's expected outcome, not a failure.
[ $rc -eq 0 ] || [ $rc -eq 3 ]
