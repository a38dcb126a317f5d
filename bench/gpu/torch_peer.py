#!/usr/bin/env python3
"""PyTorch peer of kernel_bench.cc: times the cases of cases.txt on the same GPU.

Attention: torch.nn.functional.scaled_dot_product_attention(is_causal=True) on
bf16 q/k/v viewed as [B, H, T, hd] from the model's [B, T, H, hd] layout; GQA
through enable_gqa=True where this torch has it, else k/v repeated to Hq heads
before timing. Packed cases ("docs N": N documents of T/N tokens per row,
each causal and blind to the others): the rows are viewed as B*N sequences
of T/N tokens ([B, T, H, hd] -> [B*N, T/N, H, hd], a free view) with
is_causal=True: for documents of equal length that is exactly the
block-diagonal causal mask, and the fastest way SDPA has to run it (its
flash kernel; an explicit [T, T] block-diagonal mask would send it to the
memory-efficient or math kernel and compute the masked blocks too). FLOPs
count each document's triangle, as kernel_bench.cc does. Backward: torch.autograd.grad of the forward's output with a
random upstream gradient. GEMM: x @ w.T in bf16. Each time is the median of
CUDA-event-timed runs after warm-up, on random (never zero) inputs; FLOPs as in
kernel_bench.cc. Also measures the two ceilings of the device (METHOD.md): a
device-to-device copy (bytes read + written) and a large bf16 matmul.
Prints one JSON line per measurement, "impl":"torch".
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

WARMUP = 2


def median_ms(fn, reps):
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def emit(op, case, ms, flops=None, extra=None):
    rec = {"impl": "torch", "op": op, "case": case, "ms": round(ms, 4)}
    if flops is not None:
        rec["tflops"] = round(flops / (ms * 1e-3) / 1e12, 2)
    rec.update(extra or {})
    print(json.dumps(rec), flush=True)


def bench_attention(case, B, T, Hq, Hkv, hd, docs=1):
    dev, dt = "cuda", torch.bfloat16
    B, T = B * docs, T // docs  # packed rows: each document a sequence (see the module's doc)
    q = (torch.rand(B, T, Hq, hd, device=dev, dtype=dt) * 2 - 1).transpose(1, 2).detach().requires_grad_()
    k = (torch.rand(B, T, Hkv, hd, device=dev, dtype=dt) * 2 - 1).transpose(1, 2)
    v = (torch.rand(B, T, Hkv, hd, device=dev, dtype=dt) * 2 - 1).transpose(1, 2)
    gqa = {}
    if Hkv != Hq:
        try:
            F.scaled_dot_product_attention(q[:, :, :1], k[:, :, :1], v[:, :, :1], enable_gqa=True)
            gqa = {"enable_gqa": True}
        except TypeError:  # older torch: repeat the kv heads outside the timed region
            k = k.repeat_interleave(Hq // Hkv, dim=1)
            v = v.repeat_interleave(Hq // Hkv, dim=1)
    k = k.detach().requires_grad_()
    v = v.detach().requires_grad_()
    fwd_flops = 4.0 * B * Hq * T * T * hd / 2.0

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)

    emit("attn_fwd", case, median_ms(fwd, 5), fwd_flops)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
    dout = torch.rand_like(out) * 2 - 1
    bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    emit("attn_bwd", case, median_ms(bwd, 5), 2.5 * fwd_flops)


def bench_gemm(case, M, N, K):
    x = torch.rand(M, K, device="cuda", dtype=torch.bfloat16) * 2 - 1
    w = torch.rand(N, K, device="cuda", dtype=torch.bfloat16) * 2 - 1
    emit("gemm", case, median_ms(lambda: x @ w.T, 20), 2.0 * M * N * K)


def ceilings():
    n = 1 << 30  # bytes per buffer
    src = torch.rand(n // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), 20)
    emit("copy", "device-to-device 1 GiB", ms, extra={"gbps": round(2 * n / (ms * 1e-3) / 1e9, 1)})
    bench_gemm("gemm 8192 8192 8192 (ceiling)", 8192, 8192, 8192)


def main():
    if not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    print(json.dumps({"impl": "torch", "op": "info", "torch": torch.__version__,
                      "device": torch.cuda.get_device_name(0)}), flush=True)
    ceilings()
    for line in open(sys.argv[1]):
        fields = line.split("#")[0].split()
        if not fields:
            continue
        case = " ".join(fields)
        if fields[0] == "attn":
            nums = [int(x) for x in fields[1:6]]
            extra = fields[6:]
            if extra and (len(extra) != 2 or extra[0] != "docs" or nums[1] % int(extra[1])):
                raise SystemExit(f"bad case (want attn B T Hq Hkv hd [docs N], N dividing T): {line}")
            bench_attention(case, *nums, docs=int(extra[1]) if extra else 1)
        elif fields[0] == "gemm":
            bench_gemm(case, *[int(x) for x in fields[1:]])
        else:
            raise SystemExit(f"unknown case: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
