#!/usr/bin/env bash
# Load-test sleuthd with locust for a bounded time: start a server on a free loopback port (or use
# --target), send CheckDialogue and StreamDialogue calls at a fixed rate, write locust's CSV stats
# and HTML report to a folder, print a per-RPC summary, and exit nonzero if any request failed.
#
#   loadtest/run.sh [--users N] [--spawn-rate R] [--run-time T] [--target HOST:PORT] [--out DIR] [-- LOCUST_ARGS...]
#
# Extra `sleuthd serve` flags for the server this starts: SLEUTHD_SERVE_ARGS="--workers 2 --batching off".
set -euo pipefail
cd "$(dirname "$0")/.."

users=8
spawn_rate=8
run_time=60s
target=""
out=""
usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
}
while [ $# -gt 0 ]; do
  case "$1" in
    -u|--users) users="$2"; shift 2 ;;
    -r|--spawn-rate) spawn_rate="$2"; shift 2 ;;
    -t|--run-time) run_time="$2"; shift 2 ;;
    --target) target="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
  esac
done
out="${out:-runs/loadtest/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"

server_pid=""
locust_pid=""
# Stop what this script started, on any exit. SIGTERM lets locust write its stats and the server drain
# in-flight RPCs. The INT/TERM traps turn a signal into an exit, so the EXIT trap runs then too.
cleanup() {
  for pid in $locust_pid $server_pid; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Synthesize (or find cached) speech before the clock starts, so it never counts against the run.
.venv/bin/python -m loadtest.speech

if [ -z "$target" ]; then
  # shellcheck disable=SC2086  # SLEUTHD_SERVE_ARGS is a list of flags, split on purpose
  .venv/bin/sleuthd --log-level warning serve --host 127.0.0.1 --port 0 --metrics-port -1 \
    ${SLEUTHD_SERVE_ARGS:-} >"$out/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 240); do
    grep -q "^sleuthd listening on " "$out/server.log" && break
    kill -0 $server_pid 2>/dev/null || { cat "$out/server.log" >&2; echo "server failed to start" >&2; exit 1; }
    sleep 0.25
  done
  target=$(sed -n 's/^sleuthd listening on \(.*\)$/\1/p' "$out/server.log" | head -1)
  [ -n "$target" ] || { cat "$out/server.log" >&2; echo "server did not report its port" >&2; exit 1; }
  echo "started sleuthd on $target (log: $out/server.log)"
fi

echo "locust: $users users (spawn $spawn_rate/s) for $run_time against $target; results in $out"
# Locust's output goes to the terminal and to locust.log through a tee this script can wait for.
exec {log_fd}> >(tee "$out/locust.log")
tee_pid=$!
# --stop-timeout: at the end of --run-time, calls in flight finish and are counted instead of being cut off.
# In the background with `wait`, because bash runs traps only between commands: a signal that arrives
# while a foreground locust runs would otherwise wait for the whole run.
.venv/bin/locust -f loadtest/locustfile.py --headless --only-summary \
  --host "$target" --users "$users" --spawn-rate "$spawn_rate" --run-time "$run_time" --stop-timeout 30 \
  --csv "$out/locust" --html "$out/report.html" "$@" >&"$log_fd" 2>&1 &
locust_pid=$!
set +e
wait "$locust_pid"
locust_rc=$?
locust_pid=""
exec {log_fd}>&-  # tee ends once the last writer is gone; wait so its output comes before the summary
wait "$tee_pid"
echo
.venv/bin/python -m loadtest.summary "$out/locust"
summary_rc=$?
set -e
if [ "$locust_rc" -ne 0 ] && [ "$summary_rc" -eq 0 ]; then
  echo "FAIL: locust exited $locust_rc (see $out/locust.log)" >&2
fi
[ "$locust_rc" -eq 0 ] && [ "$summary_rc" -eq 0 ]
