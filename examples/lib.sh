# Shared by the examples' run.sh scripts (sourced after ROOT and BUILD are set): BIN, TRAIN and
# CTL (the build's binaries; exit 2 naming the fix when one is missing), and
#   start_ftune RUN      `ftctl up` (ftd and a local worker) with its state in RUN/ftune, its log
#                        in RUN/up.log; sets ADDR (ftd's address) and up_pid, and stops it on exit
#   submit_job JOB MODEL TRAIN EVAL OUT [STEPS]
#                        `ftctl submit JOB --follow` with model.path, data.train, data.eval,
#                        output.dir (and train.max_steps when STEPS is given) set; prints its time
#   ask MODEL [ADAPTER]  the greedy chat answer to the question on stdin (Qwen3's template,
#                        thinking off)

BIN="$ROOT/$BUILD"
TRAIN="$BIN/engine/ft-train"
CTL="$BIN/cli/ftctl"
for bin in "$TRAIN" "$CTL"; do
  [ -x "$bin" ] || { echo "run.sh: $bin is missing: run 'make build' first (or pass the build directory)"; exit 2; }
done

up_pid=
stop_ftune() {
  if [ -n "$up_pid" ]; then kill "$up_pid" 2>/dev/null || true; wait "$up_pid" 2>/dev/null || true; fi
}
trap stop_ftune EXIT

start_ftune() {
  "$CTL" up --data-dir "$1/ftune" --listen 127.0.0.1:0 --http 127.0.0.1:0 > "$1/up.log" 2>&1 &
  up_pid=$!
  for _ in $(seq 200); do grep -q "ftune is up" "$1/up.log" && break; sleep 0.1; done
  ADDR=$(grep -o "ftd on [^,]*" "$1/up.log" | cut -d' ' -f3)
  [ -n "$ADDR" ] || { echo "ftctl up did not start:"; cat "$1/up.log"; exit 1; }
  grep -o "dashboard at [^ ]*" "$1/up.log" || true
}

submit_job() {
  local sets=(--set "model.path=$2" --set "data.train=$3" --set "data.eval=$4" --set "output.dir=$5")
  [ -n "${6:-}" ] && sets+=(--set "train.max_steps=$6")
  local start
  start=$(date +%s)
  "$CTL" --addr "$ADDR" submit "$1" "${sets[@]}" --follow
  echo "trained in $(($(date +%s) - start)) s"
}

ask() {
  local args=(generate --model "$1" --chat --chat-var enable_thinking=false --max-new-tokens 24)
  [ -n "${2:-}" ] && args+=(--adapter "$2")
  "$TRAIN" "${args[@]}" 2>/dev/null
}
