#!/usr/bin/env bash
# Checkpoint overhead: wall time of the same LoRA job with `every_steps: 50`
# versus without periodic checkpoints (both write the final one), alternating
# runs to share the machine's noise, and the measured write time per
# checkpoint. Prints the overhead in percent of training time (aim < 2%).
#
#   bench/checkpoint_overhead.sh [BUILD_DIR]     (default: build)
# Environment: FT_BENCH_STEPS (default 200), FT_BENCH_REPEATS (default 3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
FT="$BUILD/engine/ft-train"
STEPS="${FT_BENCH_STEPS:-200}"
REPEATS="${FT_BENCH_REPEATS:-3}"
[[ -x "$FT" ]] || { echo "error: $FT not found; build it first" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$FT" make-model --preset bench --out "$work/model" 2>/dev/null
/usr/bin/env python3 - "$work/data.jsonl" <<'PY'
import json, random, sys
rng = random.Random(3)
with open(sys.argv[1], "w") as f:
    for _ in range(400):
        f.write(json.dumps({"input_ids": [rng.randrange(2048) for _ in range(128)]}) + "\n")
PY

write_job() {  # $1 = dir, $2 = every_steps
  mkdir -p "$1"
  cat > "$1/job.yaml" <<YAML
model: {path: $work/model, dtype: fp32}
adapter: {type: lora, r: 16, alpha: 32}
data: {train: $work/data.jsonl, format: tokens, seq_len: 128, packing: false, shuffle: true}
train: {max_steps: $STEPS, global_batch_size: 4, micro_batch_size: 4, lr: 1.0e-4, warmup_steps: 10,
        activation_checkpointing: false}
checkpoint: {every_steps: $2, every_minutes: 0, keep: 3}
output: {dir: out}
YAML
}

run_once() {  # $1 = dir; prints wall seconds of the training loop (first step line to final checkpoint)
  rm -rf "$1/out"
  local t0 t1
  t0=$(date +%s.%N)
  "$FT" run "$1/job.yaml" 2>/dev/null
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}

write_job "$work/with" 50
write_job "$work/without" 0
with=(); without=()
for ((i = 0; i < REPEATS; i++)); do
  without+=("$(run_once "$work/without")")
  with+=("$(run_once "$work/with")")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
m_with=$(median "${with[@]}")
m_without=$(median "${without[@]}")
writes=$(grep -o '"checkpoint_seconds":[0-9.e-]*' "$work/with/out/metrics.jsonl" | cut -d: -f2 | sort -u | tr '\n' ' ')
echo "config: bench preset, LoRA r=16 all linears, seq 128, batch 4, $STEPS steps, every_steps 50 (+ final), $REPEATS runs each"
echo "without periodic checkpoints: median wall ${m_without} s  (runs: ${without[*]})"
echo "with every_steps: 50:         median wall ${m_with} s  (runs: ${with[*]})"
echo "checkpoint write times seen (s): $writes"
echo "overhead = $(python3 -c "print('%.2f' % (100 * ($m_with - $m_without) / $m_without))")%  (aim < 2%)"
