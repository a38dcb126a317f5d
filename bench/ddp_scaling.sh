#!/usr/bin/env bash
# DDP scaling on this machine: the same LoRA job (bench preset, seq 256,
# global batch 8 in micro-batches of 2, r=16 all linears) at world 1 and at
# world 2, one thread per rank, ranks as ft-train processes rendezvousing on
# loopback (engine/dist, Gloo over TCP), once with each train.gradient_sum:
# float (fp32 sums in the order they come) and exact (order-independent,
# engine/dist/exact_sum.h). Prints, per mode, tokens/s of each world, the
# speed-up, the communication share of a step and the all-reduce's time and
# bytes (host copies, rounding and upload included) from rank 0's metrics, and
# whether world 2 trained the same adapter bytes as world 1.
#
#   bench/ddp_scaling.sh [BUILD_DIR]      (default: build)
#
# Environment: FT_BENCH_STEPS (default 12; the medians are over steps 3..N),
# FT_BENCH_KEEP=1 keeps the scratch folder, FT_BENCH_STRATEGY=fsdp runs
# both worlds as FSDP (frozen weights and optimizer sharded; its per-layer
# all-gathers count as communication too). No target: the figures go into the
# notes (bench/README.md).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BUILD="${1:-build}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
FT="$BUILD/engine/ft-train"
STEPS="${FT_BENCH_STEPS:-12}"
STRATEGY="${FT_BENCH_STRATEGY:-ddp}"
SKIP=2
SEQ=256
GLOBAL=8
MICRO=2

[[ -x "$FT" ]] || { echo "error: $FT not found; build it with: cmake --build ${1:-build} --target ft-train" >&2; exit 1; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ft-ddp.XXXXXX")"
if [[ "${FT_BENCH_KEEP:-0}" == 1 ]]; then echo "scratch folder: $WORK" >&2; else trap 'rm -rf "$WORK"' EXIT; fi

# One thread per rank, passive waiting (bench/README.md: spinning OpenMP threads steal cores).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_WAIT_POLICY=passive

"$FT" --log-level warn make-model --preset bench --out "$WORK/model" --seed 1 > "$WORK/make-model.log" 2>&1
python3 - "$WORK/data.jsonl" "$SEQ" << 'EOF'
import json, random, sys
rng = random.Random(1234)
with open(sys.argv[1], "w") as f:
    for _ in range(64):
        f.write(json.dumps({"input_ids": [rng.randrange(2048) for _ in range(int(sys.argv[2]))]}) + "\n")
EOF

# job WORLD MODE: the job file of one world size and train.gradient_sum (its own output folder).
job() {
  cat > "$WORK/job-$2-$1.yaml" << EOF
model: {path: model, dtype: fp32}
adapter: {type: lora, r: 16, alpha: 32, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}
data: {train: data.jsonl, format: tokens, seq_len: $SEQ, packing: false, shuffle: false}
train: {max_steps: $STEPS, global_batch_size: $GLOBAL, micro_batch_size: $MICRO, lr: 1.0e-4, warmup_steps: 0, gradient_sum: $2}
checkpoint: {every_steps: 1000}
resources: {device: cpu, gpus: $1}
distributed: {strategy: $STRATEGY}
output: {dir: out-$2-$1}
EOF
  echo "$WORK/job-$2-$1.yaml"
}

for mode in float exact; do
  "$FT" --log-level warn run "$(job 1 $mode)" > "$WORK/$mode-world1.log" 2>&1
  port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  pids=()
  for r in 0 1; do
    "$FT" --log-level warn run "$(job 2 $mode)" --world 2 --rank $r --rendezvous "127.0.0.1:$port" \
      --dist-host 127.0.0.1 > "$WORK/$mode-world2-rank$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
done
# The all-reduce's payload per step: the trainable values times the bytes each carries.
TRAINABLE=$("$FT" plan "$(job 2 exact)" --world 2 --device-memory 64GiB | sed -n 's/^gradient sums: .*, \([0-9]*\) values;.*/\1/p')

python3 - "$WORK" "$SKIP" "$GLOBAL" "$SEQ" "$(nproc --all)" "$STRATEGY" "$TRAINABLE" << 'EOF'
import json, statistics, sys
work, skip, batch, seq, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
strategy, trainable = sys.argv[6], int(sys.argv[7])
def steps(mode, world):
    rows = [json.loads(l) for l in open(f"{work}/out-{mode}-{world}/metrics.jsonl") if l.strip()]
    return [r for r in rows if "step_seconds" in r]
def median(rows, f):
    return statistics.median(f(r) for r in rows if r["step"] > skip)
def adapter(mode, world):
    return open(f"{work}/out-{mode}-{world}/adapter/adapter_model.safetensors", "rb").read()
print(f"strategy: {strategy}")
print(f"config: bench preset (4 layers, hidden 256, vocab 2048), LoRA r=16 all linears ({trainable} values), "
      f"seq {seq}, global batch {batch} (micro 2), fp32, one thread per rank, {cores} cores")
per_value = {"float": 4, "exact": 17}
for mode in ("float", "exact"):
    one, two = steps(mode, 1), steps(mode, 2)
    t1, t2 = median(one, lambda r: r["step_seconds"]), median(two, lambda r: r["step_seconds"])
    ar = median(two, lambda r: r["allreduce_seconds"])
    comm = median(two, lambda r: (r["allreduce_seconds"] + r.get("gather_seconds", 0)) / r["step_seconds"])
    loss = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(two, one))
    same = adapter(mode, 1) == adapter(mode, 2)
    print(f"gradient_sum {mode}:")
    print(f"  world 1: {batch * seq / t1:.0f} tokens/s (median step {t1:.3f} s)")
    print(f"  world 2: {batch * seq / t2:.0f} tokens/s (median step {t2:.3f} s), speed-up {t1 / t2:.2f}x, "
          f"communication {100 * comm:.1f}% of a step (all-reduce" +
          (" + weight all-gathers)" if strategy == "fsdp" else ")"))
    print(f"  all-reduce: {1000 * ar:.1f} ms a step, {trainable * per_value[mode] / 1e6:.2f} MB of payload")
    print(f"  world 2 vs 1: losses within {loss:.2e}, adapter {'byte-identical' if same else 'differs'}")
EOF
