#!/usr/bin/env bash
# Time one LoRA training step of ftune (build/engine/ft-train) against PyTorch
# eager (bench/torch_lora_step.py) on the same 2 CPU threads and the same
# config, and print the ratio ftune / pytorch (target <= 0.5).
#
#   bench/train_step_vs_torch.sh [BUILD_DIR]      (default: build)
#
# Environment:
#   FT_BENCH_THREADS   threads for both sides (default 2)
#   FT_BENCH_STEPS     steps per side; the median is over steps 3..N (default 12)
#   FT_BENCH_DTYPE     ftune's model.dtype: fp32 (default), bf16 or fp16 (emulated on the
#                      CPU, frozen linears stored in 16 bits); PyTorch stays fp32
#   FT_BENCH_KEEP=1    keep the scratch folder (model, data, job, metrics)
#   PYTHON             interpreter for the PyTorch side (default /usr/bin/python3)
#   FT_BENCH_OMP_WAIT_POLICY  OMP_WAIT_POLICY for both sides (default passive;
#                      "default" leaves it unset, i.e. libgomp's spin-then-sleep).
#                      It matters a lot on a busy machine: see bench/README.md.
#
# See bench/README.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BUILD="${1:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
FT="$BUILD/engine/ft-train"
PY="${PYTHON:-/usr/bin/python3}"
THREADS="${FT_BENCH_THREADS:-2}"
STEPS="${FT_BENCH_STEPS:-12}"
DTYPE="${FT_BENCH_DTYPE:-fp32}"
SKIP=2          # steps 1..2 are warm-up; the median is over steps 3..STEPS
SEQ=256
BATCH=4

if [[ ! -x "$FT" ]]; then
  echo "error: $FT not found; build it with: cmake --build ${1:-build} --target ft-train" >&2
  exit 1
fi
if (( STEPS <= SKIP )); then
  echo "error: FT_BENCH_STEPS must be > $SKIP" >&2
  exit 1
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ft-bench.XXXXXX")"
if [[ "${FT_BENCH_KEEP:-0}" == 1 ]]; then
  echo "scratch folder: $WORK" >&2
else
  trap 'rm -rf "$WORK"' EXIT
fi

# Same thread count for every runtime on both sides: OpenMP, OpenBLAS (the
# pthreads build is what both ft-train and Debian's torch link), MKL if any.
export OMP_NUM_THREADS="$THREADS" OPENBLAS_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"
# Both sides use libgomp plus OpenBLAS's own pthreads. With libgomp's default
# (spinning) wait policy, idle OpenMP threads burn the cores the BLAS threads
# need, and on a loaded machine either side can become 3-10x slower at random;
# passive waiting makes both sides stable. Same policy for both sides.
WAIT_POLICY="${FT_BENCH_OMP_WAIT_POLICY:-passive}"
if [[ "$WAIT_POLICY" == default ]]; then
  unset OMP_WAIT_POLICY
else
  export OMP_WAIT_POLICY="$WAIT_POLICY"
fi

# ---- ftune -----------------------------------------------------------------
if ! "$FT" --log-level warn make-model --preset bench --out "$WORK/model" --seed 1 >"$WORK/make-model.log" 2>&1; then
  echo "error: ft-train make-model failed; its output:" >&2
  cat "$WORK/make-model.log" >&2
  exit 1
fi

# 48 sequences of exactly SEQ ids in [0, 2048), fixed seed.
"$PY" - "$WORK/data.jsonl" "$SEQ" <<'EOF'
import json, random, sys
rng = random.Random(1234)
with open(sys.argv[1], "w") as f:
    for _ in range(48):
        f.write(json.dumps({"input_ids": [rng.randrange(2048) for _ in range(int(sys.argv[2]))]}) + "\n")
EOF

cat >"$WORK/job.yaml" <<EOF
model: {path: model, dtype: $DTYPE}
adapter: {type: lora, r: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}
data: {train: data.jsonl, format: tokens, seq_len: $SEQ, packing: false, shuffle: false}
train: {max_steps: $STEPS, global_batch_size: $BATCH, micro_batch_size: $BATCH, lr: 1.0e-4, warmup_steps: 0, activation_checkpointing: false, attention: flash}
checkpoint: {every_steps: 1000}
resources: {device: cpu}
output: {dir: out}
EOF

if ! "$FT" --log-level warn run "$WORK/job.yaml" >"$WORK/ft-train.log" 2>&1; then
  echo "error: ft-train run failed; its output:" >&2
  cat "$WORK/ft-train.log" >&2
  exit 1
fi

FT_JSON="$("$PY" - "$WORK/out/metrics.jsonl" "$SKIP" "$BATCH" "$SEQ" <<'EOF'
import json, statistics, sys
path, skip, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(path) if l.strip()]
rows = [r for r in rows if "step_seconds" in r]
# steps are 1-based in metrics.jsonl; fall back to line order if "step" is absent
t = [r["step_seconds"] for i, r in enumerate(rows) if r.get("step", i + 1) > skip]
if not t:
    sys.exit("no step_seconds after warm-up in " + path)
med = statistics.median(t)
print(json.dumps({"median_step_s": med, "tokens_per_s": batch * seq / med,
                  "min_step_s": min(t), "steps_measured": len(t)}))
EOF
)"

# ---- PyTorch ---------------------------------------------------------------
TORCH_JSON="$("$PY" "$HERE/torch_lora_step.py" --threads "$THREADS" --steps "$STEPS" \
  --skip "$SKIP" --seq "$SEQ" --batch "$BATCH")"

# ---- report ------------------------------------------------------------------
"$PY" - "$FT_JSON" "$TORCH_JSON" "$THREADS" "${OMP_WAIT_POLICY:-unset (libgomp default)}" "$DTYPE" <<'EOF'
import json, sys
ft, pt, threads, wait = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
dtype = sys.argv[5]
print(f"config: bench preset (4 layers, hidden 256, intermediate 688, 8 heads / 4 kv, "
      f"vocab 2048), seq 256, batch 4, LoRA r=16 alpha=32 all linears, ftune {dtype} / pytorch fp32, AdamW, "
      f"{threads} threads (OMP_WAIT_POLICY={wait})")
print(f"torch attention: {pt['attention']}")
print(f"ftune    median step {ft['median_step_s']:.3f} s  ({ft['tokens_per_s']:.0f} tok/s)"
      f"  [min {ft['min_step_s']:.3f} s over {ft['steps_measured']} steps]")
print(f"pytorch  median step {pt['median_step_s']:.3f} s  ({pt['tokens_per_s']:.0f} tok/s)"
      f"  [min {pt['min_step_s']:.3f} s over {pt['steps_measured']} steps, torch {pt['torch']}]")
print(f"ratio ftune/pytorch = {ft['median_step_s'] / pt['median_step_s']:.2f}  (target <= 0.5)")
EOF
