#!/usr/bin/env bash
# One script for a GPU machine (H100/H200 with nvcc, CMake and PyTorch, none of
# our Debian libraries, no network), run from anywhere:
#   bench/gpu/run.sh [BUILD_DIR]
# 1. configures an engine-only CUDA build (-DFT_ENGINE_ONLY=ON -DFT_CUDA=ON) for
#    this GPU's architecture, GoogleTest from a source tree carried with the
#    repository (.carry/googletest, or FT_GTEST_SOURCE_DIR);
# 2. runs the CUDA op tests (ctest -L gpu, with FT_REQUIRE_GPU=1 so a missing
#    GPU fails instead of skipping);
#    ctest -L gpu includes the whole model on CUDA against the CPU backend
#    (tests/engine/model/cuda_parity_test.cc: LoRA and QLoRA, Llama and Qwen2 shapes,
#    fp32 and bf16, and training state moved between the devices);
# 3. checkpoints across devices through ft-train (cross_resume.py: CPU stopped
#    by SIGTERM and resumed on the GPU, GPU resumed on the CPU);
# 4. the user's job: ft-train run of a QLoRA job on a Llama-3-8B-shaped random
#    model (qlora-8b.yaml; tokens/s, peak memory, the planner's prediction),
#    then the same shape through PyTorch + transformers + PEFT (peft_peer.py);
# 5. benchmarks ftune's kernels (ft_gpu_kernel_bench) and PyTorch
#    (torch_peer.py) on the cases of cases.txt, side by side on the same GPU;
# 6. prints the tables and writes them, with device and date, to
#    docs/PERFORMANCE.md, and copies every log and the table to $OUT (the
#    device tool brings $OUT back; the device's working tree does not come back).
# The whole-model steps need ft-train, i.e. the tokenizer libraries: carry
# .carry/ftdeps.tar.xz (made by bench/gpu/carry-deps.sh); without it they are
# skipped and say so.
# Exit status: 0 when the tests passed and the benchmarks ran; 1 otherwise
# (the table is still written, with the test status in it).
# $OUT receives at most 7 files (the device tool returns at most 8):
# PERFORMANCE.md, run.log, tests.log, ours.jsonl, torch.jsonl, user_job.jsonl,
# logs.tar.gz. FT_GPU_PHASES (default "tests resume user kernels") picks phases.
# Environment: FT_GTEST_SOURCE_DIR (GoogleTest source), FT_PERF_DOC (where to
# write the table instead of docs/PERFORMANCE.md, for dry runs), FT_CMAKE_ARGS
# (extra configure arguments, word-split), FT_8B_STEPS (steps of the user's
# job, default 8).
#
# Before the run, on the development machine (GoogleTest source from Debian's
# googletest package; .carry/ is git-ignored):
#   mkdir -p .carry && cp -r /usr/src/googletest .carry/googletest
#   bench/gpu/carry-deps.sh
# then run with carry [".carry/googletest", ".carry/ftdeps.tar.xz"], e.g.
# command "bench/gpu/run.sh".
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}
out=${OUT:-$build/bench-out}
work=$build/bench-logs  # every log; packed into $out/logs.tar.gz at the end
doc=${FT_PERF_DOC:-$root/docs/PERFORMANCE.md}
gtest=${FT_GTEST_SOURCE_DIR:-$root/.carry/googletest}
mkdir -p "$out" "$work"
log() { echo "== $*" | tee -a "$work/run.log"; }
# timed LABEL CMD...: runs CMD and logs its wall time.
timed() {
  local label=$1 t0=$EPOCHREALTIME rc
  shift
  "$@"
  rc=$?
  log "$label: $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}") s wall, exit $rc"
  return $rc
}
# Copies the results to $out (also on early exits).
finish() {
  local f
  for f in run.log tests.log ours.jsonl torch.jsonl user_job.jsonl; do
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
phases=" ${FT_GPU_PHASES:-tests resume user kernels} "
want() { [[ "$phases" == *" $1 "* ]]; }
# The carried tokenizer libraries (carry-deps.sh names /tmp/ftdeps in its .pc files).
if [ -f "$root/.carry/ftdeps.tar.xz" ]; then
  tar -C / -xJf "$root/.carry/ftdeps.tar.xz"
  export PKG_CONFIG_PATH=/tmp/ftdeps/usr/lib/x86_64-linux-gnu/pkgconfig:/tmp/ftdeps/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export CMAKE_PREFIX_PATH=/tmp/ftdeps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=/tmp/ftdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
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
grep "ftune:" "$work/configure.log"
targets=(cuda_device_info_test kernels_cuda_ops_test kernels_cuda_attention_test ft_gpu_kernel_bench)
have_train=0
# engine/CMakeLists.txt says when it leaves ft-train out (no tokenizer libraries).
if ! grep -q "building engine/model only" "$work/configure.log"; then
  targets+=(ft-train engine_cuda_parity_test)
  have_train=1
fi
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

bench_ok=1
ft_train=$build/engine/ft-train
# ---- 3. checkpoints across devices ---------------------------------------------
resume_status="not run (no ft-train: carry .carry/ftdeps.tar.xz)"
if want resume && [ $have_train = 1 ]; then
  log "cross-device resume (cross_resume.py)"
  if timed "cross_resume" timeout 240 python3 "$root/bench/gpu/cross_resume.py" "$ft_train" "$build/resume" > "$work/resume.log" 2>&1; then
    resume_status="passed"
  else
    resume_status="FAILED (see resume.log)"
    bench_ok=0
  fi
  cat "$work/resume.log"
fi

# ---- 4. the user's job: QLoRA 8B shape, ours then PyTorch+PEFT --------------------
if want user && [ $have_train = 1 ]; then
  steps=${FT_8B_STEPS:-8}
  u=$build/user-job
  mkdir -p "$u"
  log "make-model --config llama3-8b (random bf16 weights)"
  timed "make-model" timeout 240 "$ft_train" make-model \
    --config "$root/bench/gpu/llama3-8b/config.json" --out "$u/model" --dtype bf16 --seed 3 2>&1 | tail -2
  python3 -c "import json,random; r=random.Random(1); [print(json.dumps({'input_ids':[r.randrange(128000) for _ in range(2048)]})) for _ in range($steps+2)]" > "$u/data.jsonl"
  sed -e "s|\${FT_8B_MODEL}|$u/model|; s|\${FT_8B_DATA}|$u/data.jsonl|; s|\${FT_8B_STEPS}|$steps|; s|\${FT_8B_OUT}|$u/out|" \
    "$root/bench/gpu/qlora-8b.yaml" > "$u/job.yaml"
  "$ft_train" plan "$u/job.yaml" --device cuda --device-memory 80GiB > "$work/plan.txt" 2>&1
  cat "$work/plan.txt"
  log "ft-train run (resources.device: cuda), $steps steps"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$work/smi_mem.txt" &
  smi=$!
  timed "ft-train run" timeout 300 "$ft_train" run "$u/job.yaml" > "$work/user_run.log" 2>&1 ||
    bench_ok=0
  kill $smi 2> /dev/null
  tail -n $((steps + 4)) "$work/user_run.log"
  python3 "$root/bench/gpu/report.py" user-job "$u/out/metrics.jsonl" "$work/plan.txt" "$work/smi_mem.txt" \
    > "$work/user_job.jsonl" || bench_ok=0
  log "PyTorch + PEFT peer (bf16 LoRA, same shape)"
  PYTHONUNBUFFERED=1 timed "peft_peer" timeout 240 python3 "$root/bench/gpu/peft_peer.py" --config "$root/bench/gpu/llama3-8b" --seq 2048 \
    --batch 1 --grad-ckpt --steps 6 --warmup 2 --r 16 --alpha 32 --out "$work/user_job.jsonl" \
    > "$work/peft.log" 2>&1 || bench_ok=0
  tail -3 "$work/peft.log"
  rm -rf "$u/model"
fi

# ---- 5. kernel benchmarks -----------------------------------------------------
if want kernels; then
  log "ftune kernels"
  "$build/bench/gpu/ft_gpu_kernel_bench" "$root/bench/gpu/cases.txt" > "$work/ours.jsonl" 2> "$work/ours.err" || bench_ok=0
  cat "$work/ours.err"
  log "PyTorch peer"
  python3 "$root/bench/gpu/torch_peer.py" "$root/bench/gpu/cases.txt" > "$work/torch.jsonl" 2> "$work/torch.err" || bench_ok=0
  tail -5 "$work/torch.err"
fi

# ---- 6. tables ------------------------------------------------------------------
grep -oE "PARITY .*" "$work/tests.log" > "$work/parity.txt" || true
grep -oE "^RESUME .*" "$work/resume.log" > "$work/resume.txt" 2> /dev/null || true
python3 "$root/bench/gpu/report.py" table "$work/ours.jsonl" "$work/torch.jsonl" "$tests_status" "$device" \
  "$doc" "$work/parity.txt" "$work/resume.txt" "$resume_status" "$work/user_job.jsonl" | tee "$work/table.md"
log "wrote $doc (copy in $out/PERFORMANCE.md)"
[[ "$tests_status" == "all passed" && $bench_ok == 1 ]]
