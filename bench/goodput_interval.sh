#!/usr/bin/env bash
# checkpoint.every auto against fixed intervals (issue #31): runs
# tests/e2e/e2e_interval_test with longer windows and several seeds. Each seed
# runs four arms side by side (every step, Young/Daly, 4x Young/Daly, auto),
# each three LoRA jobs on a loopback cluster of its own whose three workers are
# killed at exponential times of mean M (slot k of every cluster at once),
# after a warm-up window, and prints per arm: kills, checkpoints, mean write time C, checkpoint waits, work
# lost up to the kills, their sum (waste) with its standard error, and how far
# auto's interval is from sqrt(2 C M). Run it on an otherwise idle machine.
#
#   bench/goodput_interval.sh [BUILD_DIR]     (default: build)
# Environment: FT_INTERVAL_WINDOW_S (default 120), FT_INTERVAL_WARMUP_S (60),
# FT_INTERVAL_MTBF_S (20), FT_INTERVAL_SEEDS (default "31 32").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
TEST="$BUILD/tests/e2e/e2e_interval_test"
[[ -x "$TEST" ]] || { echo "error: $TEST not found; build it first (cmake --build $BUILD)" >&2; exit 1; }
export FT_INTERVAL_WINDOW_S="${FT_INTERVAL_WINDOW_S:-120}"
export FT_INTERVAL_MTBF_S="${FT_INTERVAL_MTBF_S:-20}"
for seed in ${FT_INTERVAL_SEEDS:-31 32}; do
  echo "== seed $seed, window ${FT_INTERVAL_WINDOW_S} s, M ${FT_INTERVAL_MTBF_S} s"
  FT_INTERVAL_SEED="$seed" "$TEST" 2>&1 | grep -v "^\[\|last noted\|^Running main\|^$" || true
done
