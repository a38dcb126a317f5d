#!/usr/bin/env bash
# Fuzzes every target of tests/fuzz with libFuzzer for a bounded time: a clang
# build (FT_FUZZ=ON, ASan + UBSan, no CUDA: tests/sanitize/configure.sh asan,
# the tree the ASan suite uses too) in BUILD_DIR, then each target for
# SECONDS on a scratch copy of its committed corpus (with its dictionary when
# there is one). Prints one line per target: executions, executions per
# second, coverage (edges) and features, corpus size; fails (exit 1) on any
# crash, sanitizer report, timeout (10 s) or leak, keeping the input under
# BUILD_DIR/findings/<target>/ and the log beside it.
#
# Usage: run.sh BUILD_DIR [SECONDS=20] [TARGET...]
# FT_FUZZ_SEED: libFuzzer's -seed (unset or 0: a random one, printed). The
# test gate (tests/sanitize/run.sh, so `make test` and CI) sets 1, so that it
# explores the same inputs in the same order on every run of a commit and
# cannot fail by chance; run this script without it to explore anew.
# A finding becomes a regression case: copy it into tests/fuzz/corpus/<target>/
# once fixed (the replay tests then run it in every build).
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: run.sh BUILD_DIR [SECONDS] [TARGET...]}
seconds=${2:-20}
shift $(($# >= 2 ? 2 : $#))
mkdir -p "$build"
build=$(cd "$build" && pwd)
log() { echo "fuzz: $*"; }

bash "$src/tests/sanitize/configure.sh" asan "$build" || exit 1
start=$(date +%s)
if ! cmake --build "$build" -j "$(nproc)" --target fuzz_all > "$build/build.log" 2>&1; then
  grep -E "error|Error" "$build/build.log" | head -30
  exit 1
fi
log "built the targets in $(($(date +%s) - start)) s"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$src"/tests/fuzz/*_fuzz.cc; do
    t=$(basename "$f" _fuzz.cc)
    [ -x "$build/tests/fuzz/fuzz_$t" ] && targets+=("$t")
  done
fi
seed=${FT_FUZZ_SEED:-0}
[ "$seed" = 0 ] && seed=$(( (RANDOM << 15 | RANDOM) + 1 ))
log "seed $seed (FT_FUZZ_SEED=$seed repeats this run)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:symbolize=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# One target: fuzzes it, prints its line (and a finding's report), exits non-zero on a finding.
fuzz_one() {
  local t=$1 work="$build/fuzz-work/$1" dict=() status stats execs speed cov ft corp
  rm -rf "$work" && mkdir -p "$work/corpus" "$build/findings/$t"
  cp -r "$src/tests/fuzz/corpus/$t/." "$work/corpus/" 2>/dev/null
  [ -f "$src/tests/fuzz/dict/$t.dict" ] && dict=(-dict="$src/tests/fuzz/dict/$t.dict")
  (cd "$work" && TMPDIR="$work" "$build/tests/fuzz/fuzz_$t" "$work/corpus" "${dict[@]}" \
    -seed="$seed" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2560 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$build/findings/$t/" > "$work/log.txt" 2>&1)
  status=$?
  stats=$(grep -aE "^#[0-9]+\s+DONE" "$work/log.txt" | tail -1)
  execs=$(grep -aoP "stat::number_of_executed_units:\s*\K[0-9]+" "$work/log.txt" | tail -1)
  speed=$(grep -aoP "stat::average_exec_per_sec:\s*\K[0-9]+" "$work/log.txt" | tail -1)
  cov=$(echo "$stats" | grep -oP "cov: \K[0-9]+")
  ft=$(echo "$stats" | grep -oP "ft: \K[0-9]+")
  corp=$(echo "$stats" | grep -oP "corp: \K[0-9]+")
  if [ $status -ne 0 ]; then
    cp "$work/log.txt" "$build/findings/$t/log.txt"
    log "$t: FINDING (exit $status); input and log in $build/findings/$t/"
    grep -aE "ERROR|SUMMARY|runtime error|Test unit written" "$work/log.txt" | head -8
    return 1
  fi
  log "$t: ${execs:-?} runs in ${seconds} s, ${speed:-?} exec/s, cov ${cov:-?} edges, ft ${ft:-?}, corpus ${corp:-?}"
}
# One target per core at a time (each fuzzer is one process on one core): the
# same time for each target, half the wall time on 2 cores.
parallel=${FT_FUZZ_JOBS:-$(nproc)}
rc=0
pids=()
for t in "${targets[@]}"; do
  if [ ${#pids[@]} -ge "$parallel" ]; then
    wait "${pids[0]}" || rc=1
    pids=("${pids[@]:1}")
  fi
  fuzz_one "$t" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
exit $rc
