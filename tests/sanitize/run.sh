#!/usr/bin/env bash
# The sanitizer runs of `make test`, each in a clang tree of its own
# (tests/sanitize/configure.sh):
#   asan: the tests and the binaries they start, built with ASan + UBSan, then
#         the test suite without GPU, browser, build, format and deploy tests
#         and without the end-to-end tests (e2e_test runs under TSan, the
#         chaos test in the normal tree): leaks, heap and stack errors and
#         undefined behaviour end the test with the report in its output.
#         Also left to the normal tree: the guarded twins (engine_*_guarded_
#         test: the same binaries again on the guarded backend, whose code
#         runs here inside the offload and memory tests); the cases that
#         measure figures on large presets (the 16-layer peak table, the bf16
#         storage table, the bench preset's peaks, FSDP's per-rank memory, the
#         planner's grid), whose code paths the smaller cases here run; and
#         cases that repeat paths other cases run here with more processes
#         (25 kill -9 restarts, and DPO's six: the kill -9 per memory technique
#         and DPO's kill at world 2 run here;
#         fp16 overflow's restarts; each family at world 2: world 2 and 4 run
#         here on Llama); the tokenizers' linear-time bounds and the Jinja
#         work budgets' runaway cases (timings and step counts of the normal
#         tree's optimised code; ASan's checks of the same encoder and
#         evaluator run in every other tokenizer and Jinja case, and the
#         sandbox limits case); DPO under every memory technique at once
#         (each technique's code runs here in the memory and offload tests). Under ASan these took
#         11 + 4.5 + 0.7 of the stage's 22 + 12 + 0.7 test-minutes (2 cores;
#         2026-11 and 2026-12).
#         Then every fuzz target, built in the same tree, fuzzed for
#         FT_FUZZ_SECONDS (default 10) each with FT_FUZZ_SEED (default 1: the
#         same inputs on every run, so the gate cannot fail by chance)
#         (tests/fuzz/run.sh).
#   tsan: ftd, ft-worker, ftctl, ft-train and the daemon, worker and e2e tests
#         built with ThreadSanitizer, then those tests: a data race or a lock
#         order inversion in any of those processes fails its test.
# Usage: run.sh asan|tsan BUILD_DIR
# Exit status 0 when every selected test passed with no report (and, for
# asan, no fuzzer found anything); 1 otherwise (ctest names the failing tests
# and prints their output; tests/fuzz/run.sh keeps a finding's input).
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
kind=${1:?usage: run.sh asan|tsan BUILD_DIR}
build=${2:?usage: run.sh asan|tsan BUILD_DIR}
mkdir -p "$build"
build=$(cd "$build" && pwd)
log() { echo "sanitize $kind: $*"; }
# Read before the tsan case sets OMP_NUM_THREADS, which GNU nproc obeys.
jobs=$(nproc)

bash "$src/tests/sanitize/configure.sh" "$kind" "$build" || exit 1
case "$kind" in
  asan)
    select=(-LE "gpu|web|npm|build|format|deploy|e2e" -E "_guarded_test$")
    skip=(MemoryTechniquesTest.DeviceAndHostPeaksWithEachTechniqueSixteenLayers
      MemoryTechniquesTest.Bf16StorageHalvesActivationsAndFrozenWeightsBenchPreset
      MemoryTechniquesTest.DeviceAndHostPeaksWithEachTechniqueBenchPreset
      DdpTest.FsdpShardsEachRanksMemoryAsThePlannerPredicts
      PlannerTest.PredictsTheMeasuredPeakWithinTenPercentOverAGrid
      CheckpointChaosTest.TwentyFiveKillNineRestartsEndBitIdentical
      CheckpointChaosTest.DpoKilledNineAtRandomEndsBitIdentical
      CheckpointChaosTest.AMixtureKilledNineAtRandomEndsBitIdentical
      LossScalingTest.Fp16OverflowSkipsTheStepHalvesTheScaleAndResumesExactly
      DdpTest.EachFamilyResumesAfterKillNineAtWorldTwoWithWorldOnesAdapterBytes
      'Tokenizers/GoldenTest.LongRunsEncodeInLinearTime/*'
      JinjaTest.RunawayTemplatesFailFastOnTheWorkBudget
      JinjaTest.ComparisonsOfSortsAndUniqueCountAgainstTheWorkBudget
      DpoTechniquesTest.MemoryTechniquesLeaveDpoBitIdenticalAndHalfPrecisionFollowsFp32)
    GTEST_FILTER="-$(IFS=:; echo "${skip[*]}")"
    export GTEST_FILTER
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:check_initialization_order=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    ;;
  tsan)
    select=(-R "^(daemon_|worker_|e2e_test_shard|e2e_gang_test)")
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$src/tests/sanitize/tsan.supp"
    # ft-train's threads are OpenMP's, and clang's libomp is not built with
    # TSan (its barriers are invisible to it): one thread per trainer here.
    # The trainer's parallel code is checked by the determinism tests.
    export OMP_NUM_THREADS=1
    # Two tests at a time, as the normal tree runs them: the e2e tests mostly
    # wait (leases, kills, steps), so two side by side took 352 and 385 s
    # against 642 s one at a time, each e2e shard within 15% of its time
    # alone (2 cores, 2026-11-29); their 3 s leases held in both runs.
    test_jobs=2
    ;;
esac
# The binaries the tests start, and each selected test that is built (its
# target has its name, less a shard's _shard<i>; fixtures such as the npm
# installs are not targets).
targets=(ftd ft-worker ftctl ft-train)
targets+=($(cd "$build" && comm -12 <(ctest -N "${select[@]}" | awk '/Test +#/ {print $3}' |
  sed -E 's/_shard[0-9]+$//' | sort -u) <(ninja -t targets all | cut -d: -f1 | sort)))
[ "$kind" = asan ] && targets+=(fuzz_all)
start=$(date +%s)
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" > "$build/build.log" 2>&1; then
  grep -E "error|FAILED" "$build/build.log" | head -30
  exit 1
fi
log "built in $(($(date +%s) - start)) s"
# Scratch of its own: the e2e tests name their directories, and the normal
# tree's may run at the same time.
export TEST_TMPDIR="$build/tmp"
rm -rf "$TEST_TMPDIR" && mkdir -p "$TEST_TMPDIR"
start=$(date +%s)
(cd "$build" && ctest --output-on-failure -j "${test_jobs:-$jobs}" "${select[@]}")
rc=$?
log "tests ran in $(($(date +%s) - start)) s (exit $rc)"
if [ "$kind" = asan ]; then
  FT_FUZZ_SEED=${FT_FUZZ_SEED:-1} bash "$src/tests/fuzz/run.sh" "$build" "${FT_FUZZ_SECONDS:-10}" || rc=1
fi
exit $rc
