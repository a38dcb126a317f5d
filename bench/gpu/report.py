#!/usr/bin/env python3
"""Joins kernel_bench.cc's and torch_peer.py's JSON lines into one table.

Usage: report.py OURS.jsonl TORCH.jsonl TESTS_STATUS DEVICE OUT.md
Prints the table and writes OUT.md (docs/PERFORMANCE.md's format) with the
device, the date, the CUDA test status and the ratios ftune / torch
(throughput: > 1 means ftune is faster). Rows one side lacks say so.
"""
import datetime
import json
import sys


def load(path):
    recs = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    recs.append(json.loads(line))
    except FileNotFoundError:
        pass
    return recs


def main():
    ours_path, torch_path, tests_status, device, out_path = sys.argv[1:6]
    ours = {(r["op"], r["case"]): r for r in load(ours_path)}
    torch_recs = load(torch_path)
    info = next((r for r in torch_recs if r["op"] == "info"), {})
    theirs = {(r["op"], r["case"]): r for r in torch_recs if r["op"] != "info"}
    keys = [k for k in ours] + [k for k in theirs if k not in ours and k[0] in ("attn_fwd", "attn_bwd", "gemm")]
    fmt = lambda r, f: "—" if r is None or f not in r else f"{r[f]:.2f}" if isinstance(r[f], float) else str(r[f])
    rows = ["| op | case | ftune ms | ftune TF/s | torch ms | torch TF/s | ftune/torch throughput |",
            "|---|---|---|---|---|---|---|"]
    for key in keys:
        a, b = ours.get(key), theirs.get(key)
        ratio = f"{b['ms'] / a['ms']:.2f}x" if a and b else "—"
        rows.append(f"| {key[0]} | {key[1]} | {fmt(a, 'ms')} | {fmt(a, 'tflops')} | {fmt(b, 'ms')} | "
                    f"{fmt(b, 'tflops')} | {ratio} |")
    rows.append("| qlora_step | Llama-shape QLoRA step, tokens/s and peak memory vs PyTorch+PEFT | "
                "TODO: needs the engine on CUDA (issue #9, not yet built) | — | — | — | — |")
    ceil = [r for r in torch_recs if r["op"] == "copy" or "(ceiling)" in r.get("case", "")]
    ceil_lines = [f"- {r['case']}: {r['ms']:.3f} ms" + (f", {r['gbps']} GB/s" if "gbps" in r else "") +
                  (f", {r['tflops']} TF/s" if "tflops" in r else "") for r in ceil]
    table = "\n".join(rows)
    print(table)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    doc = f"""# Performance (GPU)

Written by `bench/gpu/run.sh` on **{device}**, {date}; torch {info.get('torch', '?')}.
CUDA op tests (`ctest -L gpu`): **{tests_status}**.

Each figure is the median of CUDA-event-timed runs after warm-up, on random
bf16 inputs, ftune and PyTorch one after the other on the same GPU in the same
run. FLOPs: GEMM 2MNK; causal attention forward 2·2·B·Hq·T²·hd/2, backward
2.5× the forward (FlashAttention's convention). Aims: shared/TARGETS.md
(attention ≥ FA2, i.e. ≈ 335–370 / 322 TF/s fwd/bwd at head dim 128 on an H100).

{table}

Device ceilings measured in the same run (PyTorch):
{chr(10).join(ceil_lines) if ceil_lines else '- (not measured)'}

How to read it: the attention kernels are the first, correctness-first
version (fp32 math on CUDA cores, 32x32 tiles, no tensor cores), so expect a
large gap to SDPA until the tensor-core version lands; the GEMM goes through
cuBLASLt like torch.matmul, so its ratio should be near 1.
"""
    with open(out_path, "w") as f:
        f.write(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
