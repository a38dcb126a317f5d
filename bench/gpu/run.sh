#!/usr/bin/env bash
# One script for a GPU machine (H100/H200 with nvcc, CMake and PyTorch, none of
# our Debian libraries, no network), run from anywhere:
#   bench/gpu/run.sh [BUILD_DIR]
# 1. configures an engine-only CUDA build (-DFT_ENGINE_ONLY=ON -DFT_CUDA=ON) for
#    this GPU's architecture, GoogleTest from a source tree carried with the
#    repository (.carry/googletest, or FT_GTEST_SOURCE_DIR);
# 2. runs the CUDA op tests (ctest -L gpu, with FT_REQUIRE_GPU=1 so a missing
#    GPU fails instead of skipping);
# 3. benchmarks ftune's kernels (ft_gpu_kernel_bench) and PyTorch
#    (torch_peer.py) on the cases of cases.txt, side by side on the same GPU;
# 4. prints the table and writes it, with device and date, to
#    docs/PERFORMANCE.md, and copies every log and the table to $OUT (the
#    device tool brings $OUT back; the device's working tree does not come back).
# Exit status: 0 when the tests passed and the benchmarks ran; 1 otherwise
# (the table is still written, with the test status in it).
# $OUT receives at most 6 files (the device tool returns at most 8):
# PERFORMANCE.md, run.log, tests.log, ours.jsonl, torch.jsonl, logs.tar.gz.
# Environment: FT_GTEST_SOURCE_DIR (GoogleTest source), FT_PERF_DOC (where to
# write the table instead of docs/PERFORMANCE.md, for dry runs), FT_CMAKE_ARGS
# (extra configure arguments, word-split).
#
# Before the run, on the development machine (GoogleTest source from Debian's
# googletest package; .carry/ is git-ignored):
#   mkdir -p .carry && cp -r /usr/src/googletest .carry/googletest
# then run with carry [".carry/googletest"], e.g. command "bench/gpu/run.sh".
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$build/bench-out}
work=$build/bench-logs  # every log; packed into $out/logs.tar.gz at the end
doc=${FT_PERF_DOC:-$root/docs/PERFORMANCE.md}
gtest=${FT_GTEST_SOURCE_DIR:-$root/.carry/googletest}
mkdir -p "$out" "$work"
log() { echo "== $*" | tee -a "$work/run.log"; }
# Copies the results to $out (also on early exits).
finish() {
  local f
  for f in run.log tests.log ours.jsonl torch.jsonl; do
    if [ -f "$work/$f" ]; then cp "$work/$f" "$out/"; fi
  done
  if [ -f "$doc" ]; then cp "$doc" "$out/PERFORMANCE.md"; fi
  tar -czf "$out/logs.tar.gz" -C "$work" . 2> /dev/null || true
}
trap finish EXIT

if [ ! -f "$gtest/CMakeLists.txt" ]; then
  echo "no GoogleTest source at $gtest: copy /usr/src/googletest to .carry/googletest (see the header)" >&2
  exit 1
fi
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > "$work/nvidia-smi.txt" 2>&1; then
  echo "nvidia-smi failed: no GPU here" >&2
  exit 1
fi
device=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
log "device: $device (sm_$arch); nvcc: $(nvcc --version | tail -1)"

# ---- 1. build ---------------------------------------------------------------
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
log "configure $build"
if ! cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFT_ENGINE_ONLY=ON -DFT_CUDA=ON \
  -DFT_CUDA_ARCHITECTURES="$arch" -DFT_CUDA_RESOURCE_USAGE=ON -DFT_GTEST_SOURCE_DIR="$gtest" ${FT_CMAKE_ARGS:-} \
  > "$work/configure.log" 2>&1; then
  tail -30 "$work/configure.log"
  exit 1
fi
targets=(cuda_device_info_test kernels_cuda_ops_test kernels_cuda_attention_test ft_gpu_kernel_bench)
log "build ${targets[*]}"
if ! cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" > "$work/build.log" 2>&1; then
  tail -40 "$work/build.log"
  exit 1
fi
grep -E "spill (stores|loads)" "$work/build.log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" \
  > "$work/spills.txt" || true
log "kernels with spills: $(wc -l < "$work/spills.txt") (resource report in build.log)"

# ---- 2. CUDA op tests -------------------------------------------------------
log "ctest -L gpu"
if (cd "$build" && FT_REQUIRE_GPU=1 ctest -L gpu --output-on-failure -V > "$work/tests.log" 2>&1); then
  tests_status="all passed"
else
  tests_status="FAILED (see tests.log)"
fi
grep -E "TENSOR OK|Failure|FAILED|rel|seed" "$work/tests.log" | tail -40
log "tests: $tests_status"

# ---- 3. benchmarks ----------------------------------------------------------
bench_ok=1
log "ftune kernels"
"$build/bench/gpu/ft_gpu_kernel_bench" "$root/bench/gpu/cases.txt" > "$work/ours.jsonl" 2> "$work/ours.err" || bench_ok=0
cat "$work/ours.err"
log "PyTorch peer"
python3 "$root/bench/gpu/torch_peer.py" "$root/bench/gpu/cases.txt" > "$work/torch.jsonl" 2> "$work/torch.err" || bench_ok=0
tail -5 "$work/torch.err"

# ---- 4. table -----------------------------------------------------------------
python3 "$root/bench/gpu/report.py" "$work/ours.jsonl" "$work/torch.jsonl" "$tests_status" "$device" \
  "$doc" | tee "$work/table.md"
log "wrote $doc (copy in $out/PERFORMANCE.md)"
[[ "$tests_status" == "all passed" && $bench_ok == 1 ]]
