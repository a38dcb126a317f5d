#!/usr/bin/env python3
"""The tables of docs/PERFORMANCE.md, from the files bench/gpu/run.sh collects.

  report.py user-job METRICS.jsonl PLAN.txt SMI_MEM.txt [LABEL]
      one JSON line ("impl": "ftune") for the user's job: median tokens/s and
      step time over the steps after the first two, of it the median wait for
      the memory techniques' copies, the engine's tracked peak (every
      allocation of the device backend), nvidia-smi's peak (adds the CUDA
      context and cuBLASLt's workspace), the planner's predicted total (device,
      and host when techniques are on). LABEL names the run in the table.
  report.py table OURS.jsonl TORCH.jsonl TESTS_STATUS DEVICE OUT.md
                  PARITY.txt RESUME.txt RESUME_STATUS USER_JOB.jsonl GENERATE.txt GENERATE_STATUS
                  OPTIMES.txt
      prints the tables and writes OUT.md with the device, the date, the CUDA
      test status, the whole-model parity, cross-device resume and generation lines, the
      user's job beside PyTorch+PEFT, and the kernels: ftune's, cuDNN's attention
      route (OURS.jsonl's "impl": "cudnn" lines) and torch's side by side, with
      ftune / torch and cuDNN / torch (throughput: > 1 means faster than torch).
      Rows one side lacks say so.
  report.py cost PLAN.txt OPTIMES.txt STEPS
      the cost model's prediction (`ft-train plan --gpu`: calls and roofline
      ms per category for one step) beside FT_CUDA_OP_TIMES' measurement of
      a run of STEPS steps (its totals include loading: copies to the device
      and the conversions that load weights count there), per category:
      calls per step predicted and measured, ms per step, and measured ÷
      roofline (the efficiency of each part; 1 = at the roofline).
"""
import datetime
import json
import re
import statistics
import sys

GIB = 1 << 30


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


def user_job(metrics_path, plan_path, smi_path, label=None):
    steps = [r for r in load(metrics_path) if "loss" in r]
    timed = steps[2:] if len(steps) > 2 else steps
    plan = open(plan_path).read() if plan_path else ""
    totals = [float(v) / (1024 if unit == "MiB" else 1)
              for v, unit in re.findall(r"^\s*total\s+([0-9.]+) (GiB|MiB)", plan, re.M)]
    predicted = totals[0] if totals else None  # the device's; a second total is the host's
    try:
        smi = max(float(x) for x in open(smi_path).read().split() if x.strip()) / 1024
    except (OSError, ValueError):
        smi = None
    rec = {"impl": "ftune", "op": "user_job", "steps": len(steps),
           "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed) if timed else None,
           "step_ms_median": 1e3 * statistics.median(r["step_seconds"] for r in timed) if timed else None,
           "peak_tracked_gib": max(r["peak_bytes"] for r in steps) / GIB if steps else None,
           "peak_by_category_gib": {k: v / GIB for k, v in steps[-1]["peak_bytes_by_category"].items()}
           if steps else None,
           "copy_wait_ms_median": 1e3 * statistics.median(r.get("copy_wait_seconds", 0) for r in timed)
           if timed else None,
           "smi_peak_gib": smi, "predicted_gib": predicted,
           "predicted_host_gib": totals[1] if len(totals) > 1 else None,
           "label": label,
           "losses": [r["loss"] for r in steps]}
    print(json.dumps(rec))
    return 0 if steps else 1


def user_rows(path):
    recs = load(path)
    ours = [r for r in recs if r.get("impl") == "ftune"]
    peer = next((r for r in recs if r.get("impl") == "torch+peft"), None)
    f = lambda v, d=2: "—" if v is None else f"{v:.{d}f}"
    rows = ["| run | tokens/s | step ms | copy wait ms | peak GiB (allocator) | peak GiB (nvidia-smi) | "
            "predicted GiB (device / host) |",
            "|---|---|---|---|---|---|---|"]
    for r in ours:
        rows.append(f"| ftune QLoRA NF4+DQ r=16 all linears, seq 2048, batch 1, act. ckpt, bf16 storage "
                    f"(typed), attention on tensor cores{', ' + r['label'] if r.get('label') else ''} | "
                    f"{f(r.get('tokens_per_s'), 0)} | {f(r.get('step_ms_median'), 0)} | "
                    f"{f(r.get('copy_wait_ms_median'), 1)} | {f(r.get('peak_tracked_gib'))} | "
                    f"{f(r.get('smi_peak_gib'))} | {f(r.get('predicted_gib'))} / {f(r.get('predicted_host_gib'))} |")
    if not ours:
        rows.append("| ftune QLoRA | not run (see run.log) | | | | | |")
    if peer and "error" not in peer:
        rows.append(f"| PyTorch {peer.get('torch')} + transformers {peer.get('transformers')} + PEFT "
                    f"{peer.get('peft')}: bf16 LoRA r={peer.get('r')} all linears, seq {peer.get('seq')}, batch "
                    f"{peer.get('batch')}, grad ckpt, adapters {peer.get('adapter_dtype')} | "
                    f"{f(peer.get('tokens_per_s'), 0)} | {f(peer.get('step_ms_median'), 0)} | — | "
                    f"{f(peer.get('max_memory_allocated_gib'))} | (reserved {f(peer.get('max_memory_reserved_gib'))}) | — |")
    else:
        rows.append(f"| PyTorch + PEFT | {'failed: ' + peer['error'] if peer else 'not run'} | | | | | |")
    rows.append("| torchtune QLoRA Llama-3-8B, batch 2 (published, shared/TARGETS.md) | — | — | — | 7.4 | — | — |")
    ratio = ""
    ours = ours[0] if ours else None  # the run without memory techniques
    if ours and peer and ours.get("tokens_per_s") and peer.get("tokens_per_s"):
        ratio = (f"\nftune / PyTorch+PEFT tokens/s: **{ours['tokens_per_s'] / peer['tokens_per_s']:.2f}x** "
                 f"(aim ≥ 1.5x); peak (allocator) ftune {ours['peak_tracked_gib']:.2f} GiB (aim ≤ 6.5 GiB).\n"
                 f"ftune peak by category (GiB): "
                 + ", ".join(f"{k} {v:.2f}" for k, v in (ours.get("peak_by_category_gib") or {}).items() if v > 0)
                 + "\n")
    return "\n".join(rows) + "\n" + ratio


def kept_section(path, title):
    """The section `## {title}...` of the document at `path`, up to the next `## `: written by hand
    (the cost model's history), carried into the regenerated document; "" when absent."""
    try:
        text = open(path).read()
    except OSError:
        return ""
    start = text.find("\n## " + title)
    if start < 0:
        return ""
    end = text.find("\n## ", start + 1)
    return text[start + 1:end + 1 if end >= 0 else len(text)].rstrip() + "\n\n"


def kernel_table(keys, ours, cudnn, theirs):
    """The kernels' table: ours, cuDNN's route (attention only) and torch per case, and each
    route's throughput over torch's (> 1: faster than torch)."""
    fmt = lambda r, f: "—" if r is None or f not in r else f"{r[f]:.2f}" if isinstance(r[f], float) else str(r[f])
    ratio = lambda a, b: f"{b['ms'] / a['ms']:.2f}x" if a and b else "—"
    rows = ["| op | case | ftune ms | ftune TF/s | cuDNN ms | cuDNN TF/s | torch ms | torch TF/s | "
            "ftune/torch | cuDNN/torch |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for key in keys:
        a, c, b = ours.get(key), cudnn.get(key), theirs.get(key)
        rows.append(f"| {key[0]} | {key[1]} | {fmt(a, 'ms')} | {fmt(a, 'tflops')} | {fmt(c, 'ms')} | "
                    f"{fmt(c, 'tflops')} | {fmt(b, 'ms')} | {fmt(b, 'tflops')} | {ratio(a, b)} | {ratio(c, b)} |")
    return "\n".join(rows)


def table(argv):
    ours_path, torch_path, tests_status, device, out_path = argv[:5]
    parity_path, resume_path, resume_status, user_path, gen_path, gen_status, optimes_path = \
        (argv[5:12] + [None] * 7)[:7]
    def lines(p):
        try:
            return [l.rstrip() for l in open(p)] if p else []
        except OSError:
            return []
    parity, resume, gen = lines(parity_path), lines(resume_path), lines(gen_path)
    optimes = lines(optimes_path)
    kernel_recs = load(ours_path)
    ours = {(r["op"], r["case"]): r for r in kernel_recs if r.get("impl", "ftune") == "ftune"}
    cudnn_recs = [r for r in kernel_recs if r.get("impl") == "cudnn"]
    cudnn = {(r["op"], r["case"]): r for r in cudnn_recs if r["op"] in ("attn_fwd", "attn_bwd")}
    torch_recs = load(torch_path)
    info = next((r for r in torch_recs if r["op"] == "info"), {})
    theirs = {(r["op"], r["case"]): r for r in torch_recs if r["op"] != "info"}
    keys = [k for k in ours] + [k for k in theirs if k not in ours and k[0] in ("attn_fwd", "attn_bwd", "gemm")]
    table = kernel_table(keys, ours, cudnn, theirs)
    cudnn_info = next((r for r in cudnn_recs if r["op"] == "info"), None)
    cudnn_lines = ([f"- cuDNN {cudnn_info['version'] // 10000}.{cudnn_info['version'] // 100 % 100}."
                    f"{cudnn_info['version'] % 100} loaded (kernels/cuda/attention_cudnn.h)"] if cudnn_info else []) + \
        [f"- cuDNN route, {r['case']}: {r['error']}" for r in cudnn_recs if r["op"] == "error"]
    ceil = [r for r in torch_recs if r["op"] == "copy" or "(ceiling)" in r.get("case", "")]
    ceil_lines = [f"- {r['case']}: {r['ms']:.3f} ms" + (f", {r['gbps']} GB/s" if "gbps" in r else "") +
                  (f", {r['tflops']} TF/s" if "tflops" in r else "") for r in ceil]
    print(table)
    print("\n".join(cudnn_lines))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cost_model = kept_section(out_path, "The cost model")
    doc = f"""# Performance (GPU)

Written by `bench/gpu/run.sh` on **{device}**, {date}; torch {info.get('torch', '?')}.
CUDA tests (`ctest -L gpu`: ops against the CPU reference, and the whole
model against the CPU backend): **{tests_status}**.

## Whole model, CUDA against the CPU backend

tests/engine/model/cuda_parity_test.cc: the same random model (2 layers, hidden 256,
head dim 64/128), adapters (r = 8, all linears), micro-batches and AdamW,
6 steps on each backend. Bounds: fp32 1e-4 on losses and grad norms, 1e-3 on
trained tensors; bf16 rounding 1e-2 on losses (the bf16 goldens), 5e-2 on grad
norms and tensors.

{chr(10).join("- " + l[len("PARITY "):] for l in parity) if parity else "- (no PARITY lines: see tests.log)"}

## Checkpoints across devices (ft-train, cross_resume.py): {resume_status}

{chr(10).join("- " + l[len("RESUME "):] for l in resume) if resume else "- (not run)"}

## Generation on the device (ft-train generate, KV cache, greedy): {gen_status or "not run"}

A small random Llama (bench/gpu/small-llama, head dim 64) with the test
tokenizer, the same prompt on the CPU and on CUDA, up to 64 new tokens or EOS;
in fp32 the generated ids must be identical (bf16: reported).

{chr(10).join("- " + l[len("GENERATE "):] for l in gen) if gen else "- (not run)"}

## The user's job: QLoRA of a Llama-3-8B-shaped model at seq 2048

{user_rows(user_path) if user_path else "(not run)"}

Where its GPU time goes (FT_CUDA_OP_TIMES=1: CUDA events around every
backend op of that run, model loading included; an op's launch gaps count
against it):

```
{chr(10).join(l[len("OPTIME "):] for l in optimes) if optimes else "(not measured)"}
```

{cost_model}## Kernels

Each figure is the median of CUDA-event-timed runs after warm-up, on random
bf16 inputs, ftune and PyTorch one after the other on the same GPU in the same
run. FLOPs: GEMM 2MNK; causal attention forward 2·2·B·Hq·T²·hd/2, backward
2.5× the forward (FlashAttention's convention). Aims: shared/TARGETS.md
(attention ≥ FA2, i.e. ≈ 335–370 / 322 TF/s fwd/bwd at head dim 128 on an H100).

{table}

{chr(10).join(cudnn_lines) if cudnn_lines else "- cuDNN route: not run (no cudnn lines in ours.jsonl)"}

Device ceilings measured in the same run (PyTorch):
{chr(10).join(ceil_lines) if ceil_lines else '- (not measured)'}

How to read the attention rows: three implementations of the same causal
attention on the same inputs. "ftune" is ours (below); "cuDNN" is cuDNN 9's
fused SDPA through our route (kernels/cuda/attention_cudnn.h, what
`train.attention: cudnn` runs), timed as the backend calls it: its per-call
Prepare (lengths and offsets; with documents, a read-back and a stream
synchronisation) and, in the backward, dout rounded to bf16 and the
gradients widened to fp32 are inside its time, and its backward is the
deterministic one; both ftune's and cuDNN's backward take dout and write
dq/dk/dv in fp32, the engine's convention. "torch" is PyTorch's
scaled_dot_product_attention (its flash kernel, bf16 gradients). A "docs N"
case packs N equal documents per row: ftune and cuDNN mask them by segment
ids (cuDNN as ragged batch entries), torch runs them as B·N separate
sequences, the fastest exact form it has for equal lengths; FLOPs count each
document's triangle only. The two ratio columns are each route's throughput
over torch's; ftune against cuDNN is the ratio of their TF/s columns. The
route whose backward is faster at every case of a GPU becomes `auto`'s
choice there only when it is recorded in engine/model/attention_route.cc
(kCudnnFasterOn) with this table.

How to read it: attention runs on the tensor cores (kernels/cuda/
attention_tc_*.cu: FlashAttention-2's scheme on mma.sync m16n8k16, bf16
operands with fp32 scores, softmax and accumulation, 64-row tiles, 4 warps,
no cp.async pipelining or wgmma yet); its backward is two deterministic
kernels without atomics (dK/dV, then dQ), so S and dP are computed twice:
7 tile products where FlashAttention-2 does 5, while the FLOP count above
credits 5. The GEMM goes through cuBLASLt like torch.matmul, so its ratio
should be near 1. Under bf16 the engine stores activations, frozen weights,
embeddings and head in bf16 (typed storage); every op reads and writes them
in place and NF4 weights are dequantized straight to bf16, but the linears'
fp32 results are stored rounded and their gradients rounded for their GEMMs
("convert (typed storage)"), fp32 gradient workspaces are rounded in place
("bf16 rounding") and LoRA's fp32 weights are converted per GEMM ("operands
to bf16"): with the kernels' own gaps in the table, that is the user's job's
gap to PEFT (the cost model above says what each costs at the roofline).
"""
    with open(out_path, "w") as f:
        f.write(doc)
    return 0


PLAN_ROW = re.compile(r"^  (\S.{0,31}?) +(\d+) +(\d+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+)%")
OPTIME_ROW = re.compile(r"^OPTIME (\S.*?) +(\d+) calls +([\d.]+) ms")


def cost(plan_path, optimes_path, steps):
    """Predicted (plan) against measured (OPTIME lines) per category; see the module's doc."""
    steps = max(1, int(steps))
    predicted = {}
    with open(plan_path) as f:
        for line in f:
            m = PLAN_ROW.match(line)
            if m:
                predicted[m.group(1).strip()] = (int(m.group(2)), float(m.group(6)))
    measured = {}
    with open(optimes_path) as f:
        for line in f:
            m = OPTIME_ROW.match(line)
            if m:
                measured[m.group(1).strip()] = (int(m.group(2)), float(m.group(3)))
    print("%-32s %12s %12s %12s %12s %10s" % ("category", "calls/step", "measured", "roofline ms",
                                               "measured ms", "ratio"))
    for name in sorted(set(predicted) | set(measured), key=lambda n: -measured.get(n, (0, 0))[1]):
        p_calls, p_ms = predicted.get(name, (0, 0.0))
        m_calls, m_ms = measured.get(name, (0, 0.0))
        ratio = "%.2f" % ((m_ms / steps) / p_ms) if p_ms > 0 and m_ms > 0 else "-"
        print("%-32s %12d %12.1f %12.3f %12.3f %10s" % (name, p_calls, m_calls / steps, p_ms, m_ms / steps,
                                                          ratio))
    return 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "cost":
        return cost(*sys.argv[2:5])
    if len(sys.argv) >= 2 and sys.argv[1] == "user-job":
        return user_job(*sys.argv[2:6])
    if len(sys.argv) >= 2 and sys.argv[1] == "table":
        return table(sys.argv[2:])
    return table(sys.argv[1:])  # the old positional form


if __name__ == "__main__":
    sys.exit(main())
