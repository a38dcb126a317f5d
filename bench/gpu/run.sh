#!/usr/bin/env bash
# One script for a GPU machine (H100/H200 with nvcc, CMake and PyTorch, none of
# our Debian libraries, no network), run from anywhere:
#   bench/gpu/run.sh [BUILD_DIR]
# 1. configures an engine-only CUDA build (-DFT_ENGINE_ONLY=ON -DFT_CUDA=ON) for
#    this GPU's architecture, GoogleTest from a source tree carried with the
#    repository (.carry/googletest, or FT_GTEST_SOURCE_DIR);
# 2. runs the CUDA op tests (ctest -L gpu, with FT_REQUIRE_GPU=1 so a missing
#    GPU fails instead of skipping), cuDNN's attention route against ours and
#    the CPU among them (FT_REQUIRE_CUDNN=1 when the build found cuDNN: the
#    PyTorch's nvidia-cudnn wheel, FT_CUDNN_ROOT);
#    ctest -L gpu includes the whole model on CUDA against the CPU backend
#    (tests/engine/model/cuda_parity_test.cc: LoRA and QLoRA, Llama and Qwen2 shapes,
#    fp32 and bf16, and training state moved between the devices) and the
#    memory techniques on the copy stream (engine_offload_cuda_test: each
#    technique bit-identical to the CUDA baseline, device/host peaks and the
#    ops' wait for copies, printed);
#    then ft-train generate on a tiny model, CPU against CUDA;
# 3. benchmarks ftune's kernels and cuDNN's attention route (ft_gpu_kernel_bench)
#    and PyTorch (torch_peer.py) on the cases of cases.txt, side by side on the same GPU;
# 4. the user's job: ft-train run of a QLoRA job on a Llama-3-8B-shaped random
#    model (qlora-8b.yaml; tokens/s, peak memory, the planner's prediction),
#    again with the memory techniques on (cpu_offload, paged_adamw, activation
#    offload: device peak, predicted host bytes, copy wait per step),
#    then the same shape through PyTorch + transformers + PEFT (peft_peer.py);
# 5. checkpoints across devices through ft-train (cross_resume.py: CPU stopped
#    by SIGTERM and resumed on the GPU, GPU resumed on the CPU);
# 6. prints the tables and writes them, with device and date, to
#    docs/PERFORMANCE.md, and copies every log and the table to $OUT (the
#    device tool brings $OUT back; the device's working tree does not come back).
# The logs go to $OUT after every phase too, so a run cut off by a time limit
# still brings back what it did (each phase's wall time is in run.log).
# The whole-model steps need ft-train, i.e. the tokenizer libraries: carry
# .carry/ftdeps.tar.xz (made by bench/gpu/carry-deps.sh); without it they are
# skipped and say so.
# Exit status: 0 when the tests passed and the benchmarks ran; 1 otherwise
# (the table is still written, with the test status in it).
# $OUT receives at most 7 files (the device tool returns at most 8):
# PERFORMANCE.md, run.log, tests.log, ours.jsonl, torch.jsonl, user_job.jsonl,
# logs.tar.gz. FT_GPU_PHASES (default "tests generate kernels user resume") picks phases.
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
# timed LABEL CMD...: runs CMD and logs its wall time (to stderr: CMD's stdout may be redirected to a file).
timed() {
  local label=$1 t0=$EPOCHREALTIME rc
  shift
  "$@"
  rc=$?
  log "$label: $(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME - $t0}") s wall, exit $rc" >&2
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
phases=" ${FT_GPU_PHASES:-tests generate kernels user resume} "
want() { [[ "$phases" == *" $1 "* ]]; }
# The carried tokenizer libraries (carry-deps.sh names /tmp/ftdeps in its .pc files).
if [ -f "$root/.carry/ftdeps.tar.xz" ]; then
  tar -C / -xJf "$root/.carry/ftdeps.tar.xz"
  export PKG_CONFIG_PATH=/tmp/ftdeps/usr/lib/x86_64-linux-gnu/pkgconfig:/tmp/ftdeps/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export CMAKE_PREFIX_PATH=/tmp/ftdeps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=/tmp/ftdeps/usr/lib/x86_64-linux-gnu:/tmp/ftdeps/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
device=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
log "device: $device (sm_$arch); nvcc: $(nvcc --version | tail -1)"

# cuDNN for the cuDNN attention route (kernels/cuda/attention_cudnn.h): the
# nvidia-cudnn wheel of this machine's PyTorch (lib/libcudnn.so.9, dlopen'ed
# through FT_CUDNN_ROOT; include/ when the wheel has it, else the headers
# carry-deps.sh packed under /tmp/ftdeps/cudnn/include, else the toolkit's).
cudnn_root=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2> /dev/null || true)
cudnn_args=()
if [ -n "$cudnn_root" ] && [ -f "$cudnn_root/lib/libcudnn.so.9" ]; then
  if [ ! -f "$cudnn_root/include/cudnn_graph.h" ] && [ -f /tmp/ftdeps/cudnn/include/cudnn_graph.h ]; then
    mkdir -p "$build/cudnn-root"  # the wheel's lib/ beside the carried include/
    ln -sfn "$cudnn_root/lib" "$build/cudnn-root/lib"
    ln -sfn /tmp/ftdeps/cudnn/include "$build/cudnn-root/include"
    cudnn_root=$build/cudnn-root
  fi
  export FT_CUDNN_ROOT=$cudnn_root
  export LD_LIBRARY_PATH=$cudnn_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  cudnn_args=(-DFT_CUDNN_ROOT="$cudnn_root")
  log "cuDNN: $cudnn_root ($(ls "$cudnn_root"/lib/libcudnn.so.9* | head -1))"
else
  log "cuDNN: python3 finds no nvidia-cudnn wheel with lib/libcudnn.so.9: the cuDNN route's test skips, its bench rows say why"
fi

# ---- 1. build ---------------------------------------------------------------
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
log "configure $build"
if ! cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFT_ENGINE_ONLY=ON -DFT_CUDA=ON \
  -DFT_CUDA_ARCHITECTURES="$arch" -DFT_CUDA_RESOURCE_USAGE=ON -DFT_GTEST_SOURCE_DIR="$gtest" "${cudnn_args[@]}" ${FT_CMAKE_ARGS:-} \
  > "$work/configure.log" 2>&1; then
  tail -30 "$work/configure.log"
  exit 1
fi
grep "ftune:" "$work/configure.log"
# Built with cuDNN's headers and its library found: the route's test must run, not skip.
if grep -q "ftune: cuDNN route with" "$work/configure.log" && [ -n "${FT_CUDNN_ROOT:-}" ]; then
  export FT_REQUIRE_CUDNN=1
fi
targets=(cuda_device_info_test kernels_cuda_ops_test kernels_cuda_attention_test kernels_cuda_typed_activations_test
  kernels_cuda_attention_cudnn_test ft_gpu_kernel_bench)
have_train=0
# engine/CMakeLists.txt says when it leaves ft-train out (no tokenizer libraries).
if ! grep -q "building engine/model only" "$work/configure.log"; then
  targets+=(ft-train engine_cuda_parity_test)
  have_train=1
fi
# Every other test labelled gpu that this configuration defines (ctest -L gpu runs them all).
for t in engine_typed_ops_cuda_test engine_offload_cuda_test engine_nccl_test engine_ddp_test; do
  if cmake --build "$build" --target help 2>/dev/null | grep -qE "^(\.\.\. )?$t(:| )"; then targets+=("$t"); fi
done
log "build ${targets[*]}"
if ! timed "build" cmake --build "$build" -j "$(nproc)" --target "${targets[@]}" > "$work/build.log" 2>&1; then
  tail -40 "$work/build.log"
  exit 1
fi
grep -E "spill (stores|loads)" "$work/build.log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" \
  > "$work/spills.txt" || true
log "kernels with spills: $(wc -l < "$work/spills.txt") (resource report in build.log)"

# ---- 2. CUDA op tests -------------------------------------------------------
log "ctest -L gpu"
if timed "ctest -L gpu" bash -c "cd '$build' && FT_REQUIRE_GPU=1 ctest -L gpu --timeout 180 --output-on-failure -V > '$work/tests.log' 2>&1"; then
  tests_status="all passed"
else
  tests_status="FAILED (see tests.log)"
fi
grep -E "TENSOR OK|Failure|FAILED|rel|seed" "$work/tests.log" | tail -40
log "tests: $tests_status"
finish

bench_ok=1
ft_train=$build/engine/ft-train

# ---- 2b. generation on the device ----------------------------------------------
# ft-train generate (KV cache, greedy) on a small random Llama (small-llama,
# head dim 64) with the test tokenizer, on the CPU and on CUDA: in fp32 the
# generated ids must be the same.
gen_status="not run"
if want generate && [ $have_train = 1 ]; then
  g=$build/gen
  rm -rf "$g" && mkdir -p "$g"
  "$ft_train" make-model --config "$root/bench/gpu/small-llama" --vocab 384 --out "$g/model" --seed 5 > "$g/make.log" 2>&1
  cp "$root/tests/fuzz/data/tokenizer.json" "$root/tests/fuzz/data/tokenizer_config.json" "$g/model/"
  gen_status="passed"
  for dt in fp32 bf16; do
    for dev in cpu cuda; do
      timed "generate $dev $dt" "$ft_train" generate --model "$g/model" --prompt "the quick brown fox" \
        --max-new-tokens 64 --device $dev --dtype $dt --json > "$g/$dev-$dt.json" 2>> "$work/generate.log" ||
        gen_status="FAILED (see generate.log)"
    done
  done
  python3 - "$g" > "$work/generate.txt" 2>> "$work/generate.log" << 'PY' || gen_status="FAILED (see generate.log)"
import json, sys
d = sys.argv[1]
ok = True
for dt in ("fp32", "bf16"):
    a, b = (json.load(open(f"{d}/{dev}-{dt}.json")) for dev in ("cpu", "cuda"))
    same = next((i for i, (x, y) in enumerate(zip(a["ids"], b["ids"])) if x != y), min(len(a["ids"]), len(b["ids"])))
    print(f"GENERATE {dt}: {len(a['ids'])} ids on cpu, {len(b['ids'])} on cuda, first {same} identical "
          f"(finish {a['finish']}/{b['finish']})")
    ok = ok and (dt != "fp32" or a["ids"] == b["ids"])
sys.exit(0 if ok else 1)
PY
  cat "$work/generate.txt"
  log "generate: $gen_status"
  [[ "$gen_status" == passed ]] || bench_ok=0
fi
finish

# ---- 3. kernel benchmarks -----------------------------------------------------
if want kernels; then
  log "ftune kernels"
  timed "kernel bench" timeout 180 "$build/bench/gpu/ft_gpu_kernel_bench" "$root/bench/gpu/cases.txt" > "$work/ours.jsonl" 2> "$work/ours.err" || bench_ok=0
  cat "$work/ours.err"
  log "PyTorch peer"
  timed "torch peer" timeout 180 python3 "$root/bench/gpu/torch_peer.py" "$root/bench/gpu/cases.txt" > "$work/torch.jsonl" 2> "$work/torch.err" || bench_ok=0
  tail -5 "$work/torch.err"
fi

finish

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
  # The cost model's GPU: this one's published peaks where we have them (H100 otherwise).
  gpu_key=h100
  case "$device" in *H200*) gpu_key=h200 ;; *A100*) gpu_key=a100 ;; *L40S*) gpu_key=l40s ;; *4090*) gpu_key=4090 ;; esac
  "$ft_train" plan "$u/job.yaml" --device cuda --device-memory 80GiB --gpu $gpu_key > "$work/plan.txt" 2>&1
  cat "$work/plan.txt"
  log "ft-train run (resources.device: cuda), $steps steps"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$work/smi_mem.txt" &
  smi=$!
  run_start=$(date '+%Y-%m-%d %H:%M:%S.%3N')
  FT_CUDA_OP_TIMES=1 timed "ft-train run" timeout 240 "$ft_train" run "$u/job.yaml" > "$work/user_run.log" 2>&1 ||
    bench_ok=0
  # Time to train: from the start to "training on" (the 8B model read, quantized and copied from
  # page-locked staging on the copy stream), what a resume after a preemption waits for.
  log "ft-train started $run_start, ready to train $(grep -m1 'training on' "$work/user_run.log" | cut -c1-23)"
  grep -oE "^OPTIME .*" "$work/user_run.log" > "$work/optimes.txt" || true
  kill $smi 2> /dev/null
  log "measured ÷ roofline per op category (cost model of ft-train plan --gpu $gpu_key)"
  python3 "$root/bench/gpu/report.py" cost "$work/plan.txt" "$work/optimes.txt" "$steps" | tee "$work/cost_vs_measured.txt"
  tail -n $((steps + 4)) "$work/user_run.log"
  python3 "$root/bench/gpu/report.py" user-job "$u/out/metrics.jsonl" "$work/plan.txt" "$work/smi_mem.txt" \
    > "$work/user_job.jsonl" || bench_ok=0
  # The same job with the memory techniques on (host-resident frozen weights staged per
  # layer, paged Adam states, offloaded layer inputs): device peak, host bytes, and the
  # copy wait per step (what prefetching on the copy stream does not hide).
  techniques="--set train.cpu_offload=true --set train.optimizer=paged_adamw --set train.activation_checkpointing=offload"
  # shellcheck disable=SC2086
  "$ft_train" plan "$u/job.yaml" --device cuda --device-memory 80GiB $techniques > "$work/plan_techniques.txt" 2>&1
  cat "$work/plan_techniques.txt"
  log "ft-train run with cpu_offload, paged_adamw, activation offload, $steps steps"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$work/smi_mem_techniques.txt" &
  smi=$!
  # shellcheck disable=SC2086
  timed "ft-train run (techniques)" timeout 300 "$ft_train" run "$u/job.yaml" $techniques --set output.dir="$u/out-techniques" \
    > "$work/user_run_techniques.log" 2>&1 || bench_ok=0
  kill $smi 2> /dev/null
  tail -n 4 "$work/user_run_techniques.log"
  python3 "$root/bench/gpu/report.py" user-job "$u/out-techniques/metrics.jsonl" "$work/plan_techniques.txt" \
    "$work/smi_mem_techniques.txt" "cpu_offload + paged_adamw + activation offload" >> "$work/user_job.jsonl" || bench_ok=0
  log "PyTorch + PEFT peer (bf16 LoRA, same shape)"
  PYTHONUNBUFFERED=1 timed "peft_peer" timeout 240 python3 "$root/bench/gpu/peft_peer.py" --config "$root/bench/gpu/llama3-8b" --seq 2048 \
    --batch 1 --grad-ckpt --steps 6 --warmup 2 --r 16 --alpha 32 --out "$work/user_job.jsonl" \
    > "$work/peft.log" 2>&1 || bench_ok=0
  tail -3 "$work/peft.log"
  rm -rf "$u/model"
fi

finish

# ---- 5. checkpoints across devices ---------------------------------------------
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

finish

# ---- 6. tables ------------------------------------------------------------------
grep -oE "PARITY .*" "$work/tests.log" > "$work/parity.txt" || true
grep -oE "^RESUME .*" "$work/resume.log" > "$work/resume.txt" 2> /dev/null || true
[ -f "$work/generate.txt" ] || echo "GENERATE $gen_status" > "$work/generate.txt"
python3 "$root/bench/gpu/report.py" table "$work/ours.jsonl" "$work/torch.jsonl" "$tests_status" "$device" \
  "$doc" "$work/parity.txt" "$work/resume.txt" "$resume_status" "$work/user_job.jsonl" "$work/generate.txt" "$gen_status" "$work/optimes.txt" |
  tee "$work/table.md"
log "wrote $doc (copy in $out/PERFORMANCE.md)"
[[ "$tests_status" == "all passed" && $bench_ok == 1 ]]
