#!/usr/bin/env python3
"""Checkpoints move between devices: a run on the CPU stopped by SIGTERM and
resumed on the GPU, and a run on the GPU resumed on the CPU, each against the
whole run on the CPU (the reference) and the whole run on the GPU.

Usage: cross_resume.py FT_TRAIN WORKDIR [--steps 40]
Makes a small Llama (bench/gpu/small-llama, head dim 64: a shape the CUDA
attention takes) with `ft-train make-model --config`, random token data, and a
LoRA job (fp32, constant LR) that differs between the runs only in
resources.device and max_steps, neither of which is part of the training
math. Compares per-step losses (metrics.jsonl, ≤ 1e-4 relative: the fp32
bound) and the final adapters (norm-wise, ≤ 1e-3). Prints one "RESUME" line
per scenario and exits 1 if any bound is missed.
"""
import argparse
import json
import math
import os
import random
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

JOB = """name: cross-resume
model: {{path: {model}, dtype: fp32}}
adapter: {{type: lora, r: 8, alpha: 16, target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]}}
data: {{train: {data}, format: tokens, seq_len: 128, packing: false, shuffle: true}}
train: {{max_steps: {steps}, global_batch_size: 4, micro_batch_size: 2, lr: 1.0e-3, lr_schedule: constant, seed: 7}}
checkpoint: {{every_steps: 4, every_minutes: 0, keep: 3}}
resources: {{device: {device}}}
output: {{dir: {out}}}
"""


def write_job(work, name, device, steps, out):
    path = os.path.join(work, f"{name}.yaml")
    with open(path, "w") as f:
        f.write(JOB.format(model=os.path.join(work, "model"), data=os.path.join(work, "data.jsonl"),
                           steps=steps, device=device, out=out))
    return path


def losses(out):
    got = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j:
                got[j["step"]] = j["loss"]
    return got


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", t["dtype"]
        a, b = t["data_offsets"]
        out[name] = struct.unpack(f"<{(b - a) // 4}f", data[a:b])
    return out


def adapter_rel(out, ref):
    a = read_safetensors(os.path.join(out, "adapter", "adapter_model.safetensors"))
    b = read_safetensors(os.path.join(ref, "adapter", "adapter_model.safetensors"))
    diff = sum((x - y) ** 2 for k in b for x, y in zip(a[k], b[k]))
    norm = sum(y * y for k in b for y in b[k])
    return math.sqrt(diff / norm)


def run(ft_train, job, check=True):
    r = subprocess.run([ft_train, "run", job], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        sys.stderr.write(r.stdout[-3000:])
        raise SystemExit(f"ft-train run {job}: exit {r.returncode}")
    return r


def run_until_sigterm(ft_train, job, out, after_step):
    """Starts a run, sends SIGTERM once metrics.jsonl shows `after_step`, returns the exit code."""
    p = subprocess.Popen([ft_train, "run", job], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = os.path.join(out, "metrics.jsonl")
    while p.poll() is None:
        try:
            if max(losses(out), default=0) >= after_step:
                p.send_signal(signal.SIGTERM)
                break
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.005)
    return p.wait(), max(losses(out), default=0) if os.path.exists(metrics) else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ft_train")
    ap.add_argument("work")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--gpu", default="cuda", help="the device to compare with the CPU (cpu: a dry run of the script)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    subprocess.run([a.ft_train, "make-model", "--config", os.path.join(HERE, "small-llama"), "--out",
                    os.path.join(a.work, "model"), "--seed", "11"], check=True, stderr=subprocess.DEVNULL)
    rng = random.Random(5)
    with open(os.path.join(a.work, "data.jsonl"), "w") as f:
        for _ in range(96):
            f.write(json.dumps({"input_ids": [rng.randrange(3, 512) for _ in range(128)]}) + "\n")
    steps, half = a.steps, a.steps // 2
    outs = {k: os.path.join(a.work, k) for k in ("cpu", "cuda", "cpu_then_cuda", "cuda_then_cpu")}
    run(a.ft_train, write_job(a.work, "cpu", "cpu", steps, outs["cpu"]))
    run(a.ft_train, write_job(a.work, "cuda", a.gpu, steps, outs["cuda"]))
    # CPU, stopped by SIGTERM mid-run (exit 3: preempted after a checkpoint), resumed on the GPU.
    rc, stopped = run_until_sigterm(a.ft_train, write_job(a.work, "c1", "cpu", steps, outs["cpu_then_cuda"]),
                                    outs["cpu_then_cuda"], half)
    run(a.ft_train, write_job(a.work, "c2", a.gpu, steps, outs["cpu_then_cuda"]))
    sigterm = f"SIGTERM at step {stopped}, exit {rc}"
    # GPU for the first half (its final checkpoint), the CPU for the rest.
    run(a.ft_train, write_job(a.work, "g1", a.gpu, half, outs["cuda_then_cpu"]))
    run(a.ft_train, write_job(a.work, "g2", "cpu", steps, outs["cuda_then_cpu"]))
    ref = losses(outs["cpu"])
    ok = rc == 3 and len(ref) == steps
    for name in ("cuda", "cpu_then_cuda", "cuda_then_cpu"):
        got = losses(outs[name])
        worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref) if set(got) == set(ref) else math.inf
        rel = adapter_rel(outs[name], outs["cpu"])
        good = worst <= 1e-4 and rel <= 1e-3
        ok = ok and good
        extra = f" ({sigterm})" if name == "cpu_then_cuda" else ""
        print(f"RESUME {name}{extra}: {len(got)} steps, worst loss rel vs cpu {worst:.2e} (bound 1e-04), "
              f"adapter rel {rel:.2e} (bound 1e-03): {'OK' if good else 'NOT OK'}", flush=True)
    print(f"RESUME first/last loss (cpu): {ref[1]:.4f} -> {ref[steps]:.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
