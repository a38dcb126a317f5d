#!/usr/bin/env python3
"""PyTorch + transformers + PEFT peer of ftune's LoRA training step on one GPU.

Measures what a stock Hugging Face LoRA fine-tune costs on the same model shape
that ft-train runs in bench/gpu/run.sh: throughput (tokens/s from the median
step time) and peak CUDA memory of full training steps (forward with labels ->
loss, backward, AdamW step, zero_grad) on a model with random weights.

  * Model: AutoModelForCausalLM.from_config(config.json), built directly on the
    GPU in --dtype (bf16 by default), attention "sdpa". --config is a
    config.json or a directory holding one (e.g. a Llama-3-8B shape). Weights
    are random: only time and memory matter; the losses are printed as a check
    that the step really trains.
  * LoRA: peft LoraConfig(r, lora_alpha, lora_dropout=0) on q,k,v,o,gate,up,
    down_proj; get_peft_model with PEFT's default autocast_adapter_dtype=True,
    which keeps adapter weights in fp32 on a bf16 base (--adapter-base-dtype
    keeps them in the base dtype instead). "adapter_dtype" says which.
  * --grad-ckpt: gradient_checkpointing_enable(use_reentrant=False) plus
    enable_input_require_grads().
  * Optimizer: torch.optim.AdamW(lr=1e-4, fused=True where supported).
  * Data: one fixed batch of random token ids, labels = input ids.
  * Timing: torch.cuda.synchronize + time.perf_counter around each step;
    --warmup untimed steps first, median over --steps timed ones. Peak memory:
    torch.cuda.max_memory_allocated/reserved since a reset just before the
    first step (so it includes the weights).

Prints one JSON line ("impl": "torch+peft") to stdout and appends it to --out
if given; progress goes to stderr. Exit status: 0 on success, 2 when torch,
transformers, peft or a CUDA device is missing, 3 on CUDA out-of-memory (a JSON
line with "error": "oom" is still printed). Needs no network (HF_HUB_OFFLINE).

  python3 bench/gpu/peft_peer.py --config CONFIG_JSON_OR_DIR [--seq 2048]
      [--batch 1] [--steps 6] [--warmup 2] [--r 16] [--alpha 32] [--grad-ckpt]
      [--dtype bf16] [--adapter-base-dtype] [--out FILE.jsonl]
"""
import argparse
import json
import os
import statistics
import sys
import time

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GIB = 1024 ** 3


def log(msg):
    print(f"[peft_peer] {msg}", file=sys.stderr, flush=True)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="config.json, or a directory containing one")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--alpha", type=int, default=32)
    ap.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing (non-reentrant)")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16", help="base weight dtype")
    ap.add_argument("--adapter-base-dtype", action="store_true",
                    help="autocast_adapter_dtype=False: LoRA weights in the base dtype, not fp32")
    ap.add_argument("--out", help="append the JSON line to this file too")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.seq < 2 or args.batch < 1:
        ap.error("need --steps >= 1, --warmup >= 0, --seq >= 2, --batch >= 1")
    return args


def load_config_dict(path):
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path) as f:
        d = json.load(f)
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    stem = os.path.splitext(os.path.basename(path))[0]
    return d, (folder if stem == "config" else stem)


def emit(rec, out):
    line = json.dumps(rec)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def main():
    args = parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import torch
        import transformers
        import peft
        from transformers import AutoModelForCausalLM
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError as e:
        print(f"peft_peer: needs torch, transformers and peft: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("peft_peer: no CUDA device available (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    cfg_dict, name = load_config_dict(args.config)
    cfg = CONFIG_MAPPING[cfg_dict["model_type"]].from_dict(cfg_dict)
    model_desc = {"name": name, "model_type": cfg_dict["model_type"], "hidden": cfg.hidden_size,
                  "layers": cfg.num_hidden_layers, "vocab": cfg.vocab_size}
    rec = {"impl": "torch+peft", "model": model_desc, "config": args.config, "seq": args.seq,
           "batch": args.batch, "r": args.r, "alpha": args.alpha, "grad_ckpt": args.grad_ckpt, "dtype": args.dtype,
           "torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
           "device": torch.cuda.get_device_name()}
    log(f"{name}: {model_desc}, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, peft {peft.__version__}")

    torch.manual_seed(0)
    # transformers >= 4.56 calls it `dtype` (`torch_dtype` deprecated); older ones only know `torch_dtype`.
    version = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    dtype_kw = {"dtype": dtype} if version >= (4, 56) else {"torch_dtype": dtype}
    t0 = time.perf_counter()
    with torch.device("cuda"):  # parameters are created on the GPU, never on the CPU
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", **dtype_kw)
    model.config.use_cache = False
    torch.cuda.synchronize()
    log(f"built {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params, "
        f"{next(model.parameters()).dtype}) in {time.perf_counter() - t0:.1f} s")

    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    lora = peft.LoraConfig(r=args.r, lora_alpha=args.alpha, lora_dropout=0.0, bias="none",
                           target_modules=TARGETS, task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lora, autocast_adapter_dtype=not args.adapter_base_dtype)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    adapter_dtypes = sorted({str(p.dtype).replace("torch.", "") for n, p in model.named_parameters()
                             if p.requires_grad and "lora_" in n})
    rec["trainable_params"] = sum(p.numel() for p in params)
    rec["adapter_dtype"] = ",".join(adapter_dtypes)
    log(f"LoRA r={args.r} alpha={args.alpha}: {rec['trainable_params']} trainable params ({rec['adapter_dtype']})")

    try:
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        rec["fused_adamw"] = True
    except (TypeError, RuntimeError, ValueError):
        opt = torch.optim.AdamW(params, lr=1e-4)
        rec["fused_adamw"] = False

    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), device="cuda")
    losses, times = [], []
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    try:
        for step in range(args.warmup + args.steps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            losses.append(round(loss.item(), 4))
            if step >= args.warmup:
                times.append(dt)
            log(f"step {step + 1}/{args.warmup + args.steps}{' (warmup)' if step < args.warmup else ''}: "
                f"{dt * 1e3:.1f} ms, loss {losses[-1]}")
    except torch.cuda.OutOfMemoryError as e:
        log(f"CUDA out of memory: {e}")
        rec.update(error="oom", losses=losses,
                   max_memory_allocated_gib=round(torch.cuda.max_memory_allocated() / GIB, 3),
                   max_memory_reserved_gib=round(torch.cuda.max_memory_reserved() / GIB, 3))
        emit(rec, args.out)
        return 3

    med = statistics.median(times)
    rec.update(tokens_per_s=round(args.batch * args.seq / med, 1), step_ms_median=round(med * 1e3, 2),
               step_ms=[round(t * 1e3, 2) for t in times], warmup=args.warmup,
               max_memory_allocated_gib=round(torch.cuda.max_memory_allocated() / GIB, 3),
               max_memory_reserved_gib=round(torch.cuda.max_memory_reserved() / GIB, 3),
               losses=losses)
    emit(rec, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
