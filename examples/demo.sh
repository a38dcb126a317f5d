#!/usr/bin/env bash
# The ftune demo: a local ftd and two ft-workers, a LoRA job submitted with
# ftctl, the worker running it killed with SIGKILL mid-run (a node lost without
# notice), and the job resuming on the other worker from its last committed
# checkpoint and finishing. Run from the repository root after a build:
#   make demo        (or: bash examples/demo.sh [BUILD_DIR])
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$ROOT/$BUILD"
RUN="$ROOT/runs/demo"
ADDR=127.0.0.1:7171
rm -rf "$RUN" && mkdir -p "$RUN"
cleanup() {
  kill -9 "${pids[@]}" 2>/dev/null || true
  pkill -9 -f "$RUN[/]w-" 2>/dev/null || true
  wait 2>/dev/null || true
}
pids=()
trap cleanup EXIT

"$BIN/engine/ft-train" make-model --preset tiny-llama --out "$RUN/model" 2>/dev/null
"$BIN/daemon/ftd" --listen "$ADDR" --data-dir "$RUN/ftd" --lease-ms 3000 --heartbeat-ms 500 > "$RUN/ftd.log" 2>&1 &
pids+=($!)
sleep 0.5
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
pkill -9 -f "ft-worker --daemon $ADDR --id $victim " || true
pkill -9 -f "$RUN[/]w-$victim/" || true
"$CTL" watch "$JOB" || true
"$CTL" status "$JOB"
echo
echo "adapter: $RUN/out/adapter   (PEFT format)"
echo "events:  $CTL --addr $ADDR events $JOB"
