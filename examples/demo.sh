#!/usr/bin/env bash
# The ftune demo: a local ftd and two ft-workers, a LoRA job submitted with
# ftctl, the worker running it killed with SIGKILL mid-run (a node lost without
# notice), and the job resuming on the other worker from its last committed
# checkpoint and finishing. The dashboard shows it live at the address printed
# first. Run from the repository root after a build:
#   make demo        (or: bash examples/demo.sh [BUILD_DIR])
# FTUNE_DEMO_LINGER=SECONDS keeps ftd and the dashboard up that long at the end
# (default 0: exit at once).
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$ROOT/$BUILD"
RUN="$ROOT/runs/demo"
ADDR=127.0.0.1:7171
HTTP=127.0.0.1:7172
rm -rf "$RUN" && mkdir -p "$RUN"
cleanup() {
  exec 2>/dev/null  # no "Killed" job reports
  kill -9 "${pids[@]}" 2>/dev/null || true
  pkill -9 -f "$RUN[/]w-" 2>/dev/null || true
  wait 2>/dev/null || true
}
pids=()
trap cleanup EXIT

"$BIN/engine/ft-train" make-model --preset tiny-llama --out "$RUN/model" 2>/dev/null
"$BIN/daemon/ftd" --listen "$ADDR" --http "$HTTP" --data-dir "$RUN/ftd" --lease-ms 3000 --heartbeat-ms 500 \
  > "$RUN/ftd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "ftd: dashboard at" "$RUN/ftd.log" && break; sleep 0.1; done
DASHBOARD=$(grep -o "ftd: dashboard at [^ ]*" "$RUN/ftd.log" | cut -d' ' -f4)
[ -n "$DASHBOARD" ] || { echo "ftd did not start:"; cat "$RUN/ftd.log"; exit 1; }
echo "dashboard: $DASHBOARD  (open it to watch the run live)"
for w in w1 w2; do
  "$BIN/worker/ft-worker" --daemon "$ADDR" --id "$w" --ft-train "$BIN/engine/ft-train" --work-dir "$RUN/w-$w" \
    --cpu-memory 4GiB > "$RUN/$w.log" 2>&1 &
  pids+=($!)
done
export FTUNE_ADDR=$ADDR
CTL="$BIN/cli/ftctl"
JOB=$("$CTL" submit "$ROOT/examples/demo.yaml")
echo "submitted $JOB; waiting for 60 steps..."
while :; do
  line=$("$CTL" --json status "$JOB" | tr -d ' \n')
  step=$(echo "$line" | grep -o '"steps_done":"[0-9]*"' | grep -o '[0-9]*' || echo 0)
  [ "${step:-0}" -ge 60 ] && break
  sleep 0.2
done
victim=$(echo "$line" | grep -o '"worker_id":"w[12]"' | tail -1 | grep -o 'w[12]')
echo "killing $victim (SIGKILL, worker and trainer) at step $step"
# The node dies at once: its worker and its trainer in one pkill.
pkill -9 -f "(ft-worker --daemon $ADDR --id $victim |$RUN[/]w-$victim/)" || true
"$CTL" watch "$JOB" || true
"$CTL" status "$JOB"
echo
echo "adapter:   $RUN/out/adapter   (PEFT format)"
echo "events:    $CTL --addr $ADDR events $JOB"
echo "dashboard: ${DASHBOARD}#/jobs/$JOB"
if [ "${FTUNE_DEMO_LINGER:-0}" -gt 0 ]; then
  echo "keeping ftd and the dashboard up for ${FTUNE_DEMO_LINGER} s (Ctrl-C to stop)"
  sleep "$FTUNE_DEMO_LINGER"
fi
