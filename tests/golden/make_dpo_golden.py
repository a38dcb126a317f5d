#!/usr/bin/python3
"""Golden reference values for ftune's DPO / IPO objective (train.objective: dpo).

A float64 re-implementation of TRL's DPOTrainer loss (trl/trainer/dpo_trainer.py: dpo_loss,
concatenated_forward) on a PEFT LoRA model whose reference is the same model with the adapter
switched off, and on a full fine-tune whose reference is a frozen copy of the initial weights
(TRL's ref_model), trained with HF Trainer's AdamW + cosine schedule + clip_grad_norm_ exactly as
make_golden.py's SFT cases. The model, its LoRA and the optimizer come from make_golden.py.

What it makes, per case (tests/golden/<case>/):
    data.jsonl                 {"prompt_ids", "chosen_ids", "rejected_ids"} per line
    eval.jsonl                 held-out pairs (data.eval)
    job.yaml                   the ftune job (llama_gqa's model and initial adapter)
    expected/metrics.json      per step: loss, lr, grad_norm, pairs, and TRL's rewards/chosen,
                               rewards/rejected, rewards/margins, rewards/accuracies,
                               logps/chosen, logps/rejected (means over the step's pairs)
    expected/eval.json         TRL's evaluation of the trained weights on eval.jsonl: eval_loss and
                               eval_rewards/*, eval_logps/* (means over its pairs)
    expected/final.safetensors the trained adapter (dpo_full: every trained weight)

Semantics (TRL):
  - A response's log-probability is the sum over its tokens t of log softmax(logits[t-1])[id_t],
    the prompt's tokens excluded (IPO: the mean over the response's tokens).
  - z = (pi_chosen - ref_chosen) - (pi_rejected - ref_rejected);
    sigmoid: loss = -(1 - eps) log sigmoid(beta z) - eps log sigmoid(-beta z);
    ipo:     loss = (z - 1 / (2 beta))^2.
  - The step's loss is the mean over its pairs; rewards = beta (pi - ref), detached.
  - dpo_rpo: TRL's rpo_alpha adds alpha x the chosen response's mean token NLL to each pair's loss
    (TRL averages over the batch's chosen tokens; per pair here, as ftune does).

Rerun:  /usr/bin/python3 tests/golden/make_dpo_golden.py
"""

import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden as g  # noqa: E402  (the model, LoRA, AdamW and file writers)

N_PAIRS = 16
N_EVAL = 6  # data.eval: drawn after the training pairs from the same generator
GLOBAL_PAIRS, MICRO_PAIRS = 4, 2
STEPS = 4
SEQ_LEN, MAX_PROMPT = 32, 12

LORA = dict(type="lora", r=4, alpha=8, rslora=False, targets=g.ALL_LINEARS)
FULL_CLIP = 2.0
CASES = [
    dict(name="dpo_sigmoid", loss="sigmoid", beta=0.1, label_smoothing=0.0, lr=1e-2, max_grad_norm=0.8),
    dict(name="dpo_sigmoid_ls", loss="sigmoid", beta=0.5, label_smoothing=0.2, lr=1e-2, max_grad_norm=2.5),
    dict(name="dpo_ipo", loss="ipo", beta=0.5, label_smoothing=0.0, lr=1e-2, max_grad_norm=5.3),
    dict(name="dpo_qlora", loss="sigmoid", beta=0.1, label_smoothing=0.0, lr=1e-2, max_grad_norm=0.8,
         quant=dict(type="nf4", block=64, double_quant=True, dq_block=256)),
    dict(name="dpo_rpo", loss="sigmoid", beta=0.1, label_smoothing=0.0, lr=1e-2, max_grad_norm=1.6, rpo_alpha=0.5),
    dict(name="dpo_full", loss="sigmoid", beta=0.1, label_smoothing=0.0, lr=1e-3, max_grad_norm=FULL_CLIP, full=True),
]


def make_pairs(vocab, gen):
    """Prompts of 3..10 ids, responses of 2..12; chosen responses draw from a small "preferred" id
    set more often than rejected ones, so the margin can grow."""
    preferred = (torch.randperm(vocab - 1, generator=gen)[:12] + 1).tolist()
    pairs = []
    for _ in range(N_PAIRS + N_EVAL):
        n_p = int(torch.randint(3, 11, (1,), generator=gen))
        prompt = torch.randint(1, vocab, (n_p,), generator=gen).tolist()

        def response(p_pref):
            n = int(torch.randint(2, 13, (1,), generator=gen))
            pick = (torch.rand(n, generator=gen, dtype=g.F64) < p_pref).tolist()
            pref = torch.randint(0, len(preferred), (n,), generator=gen).tolist()
            other = torch.randint(1, vocab, (n,), generator=gen).tolist()
            return [preferred[f] if k else o for k, f, o in zip(pick, pref, other)]

        pairs.append({"prompt_ids": prompt, "chosen_ids": response(0.7), "rejected_ids": response(0.1)})
    return pairs


def response_logps(P, ctx, prompt, response, mean):
    """Sum (mean) over the response's tokens of their log-probabilities given everything before."""
    ids = torch.tensor([prompt + response])
    logp = torch.log_softmax(g.forward(P, ctx, ids)[0], dim=-1)
    n_p = len(prompt)
    picked = torch.stack([logp[t - 1, ids[0, t]] for t in range(n_p, n_p + len(response))])
    return picked.mean() if mean else picked.sum()


def pair_terms(P, ctx, case, pair):
    """(loss, chosen reward, rejected reward, pi_chosen, pi_rejected) of one pair (TRL's dpo_loss)."""
    mean = case["loss"] == "ipo"
    pc = response_logps(P, ctx, pair["prompt_ids"], pair["chosen_ids"], mean)
    pr = response_logps(P, ctx, pair["prompt_ids"], pair["rejected_ids"], mean)
    with torch.no_grad():  # the reference: the frozen initial weights, or the adapter off
        ref_p, off = (ctx["ref"], ctx) if ctx["full"] else (P, dict(ctx, lora_scale=0.0))
        rc = response_logps(ref_p, off, pair["prompt_ids"], pair["chosen_ids"], mean)
        rr = response_logps(ref_p, off, pair["prompt_ids"], pair["rejected_ids"], mean)
    z = (pc - rc) - (pr - rr)
    beta, eps = case["beta"], case["label_smoothing"]
    if case["loss"] == "sigmoid":
        loss = -(1 - eps) * F.logsigmoid(beta * z) - eps * F.logsigmoid(-beta * z)
    else:
        loss = (z - 1 / (2 * beta)) ** 2
    if case.get("rpo_alpha"):  # TRL's RPO: + alpha x the chosen response's mean token NLL (per pair)
        loss = loss - case["rpo_alpha"] * response_logps(P, ctx, pair["prompt_ids"], pair["chosen_ids"], True)
    return loss, beta * (pc - rc).item(), beta * (pr - rr).item(), pc.item(), pr.item()


def train(P, ctx, case, trainable, pairs):
    names = list(trainable)
    if ctx["full"]:  # HF Trainer: no weight decay for biases and norm weights (make_golden.train)
        decay = [not (n.endswith(".bias") or "norm" in n) for n in names]
        groups = [{"params": [trainable[n] for n, d in zip(names, decay) if d], "weight_decay": g.WEIGHT_DECAY},
                  {"params": [trainable[n] for n, d in zip(names, decay) if not d], "weight_decay": 0.0}]
    else:
        groups = [{"params": [trainable[n] for n in names], "weight_decay": g.WEIGHT_DECAY}]
    opt = torch.optim.AdamW(groups, lr=case["lr"], betas=g.BETAS, eps=g.ADAM_EPS, weight_decay=g.WEIGHT_DECAY)
    keys = ["loss", "lr", "grad_norm", "pairs", "rewards/chosen", "rewards/rejected", "rewards/margins",
            "rewards/accuracies", "logps/chosen", "logps/rejected"]
    metrics = {k: [] for k in keys}
    for s in range(STEPS):
        batch = pairs[s * GLOBAL_PAIRS:(s + 1) * GLOBAL_PAIRS]
        opt.zero_grad(set_to_none=True)
        sums = {k: 0.0 for k in keys}
        for mb in range(0, GLOBAL_PAIRS, MICRO_PAIRS):
            micro_loss = 0.0
            for pair in batch[mb:mb + MICRO_PAIRS]:
                loss, rc, rr, pc, pr = pair_terms(P, ctx, case, pair)
                micro_loss = micro_loss + loss
                sums["loss"] += loss.item()
                sums["rewards/chosen"] += rc
                sums["rewards/rejected"] += rr
                sums["rewards/margins"] += rc - rr
                sums["rewards/accuracies"] += 1.0 if rc > rr else 0.0
                sums["logps/chosen"] += pc
                sums["logps/rejected"] += pr
            (micro_loss / GLOBAL_PAIRS).backward()  # normalised by the GLOBAL pair count
        params = [trainable[n] for n in names]
        norm = torch.nn.utils.clip_grad_norm_(params, case["max_grad_norm"]).item()
        step_lr = case["lr"] * g.lr_mult(s, STEPS)
        for group in opt.param_groups:
            group["lr"] = step_lr
        opt.step()
        for k in keys:
            if k.startswith("rewards/") or k.startswith("logps/") or k == "loss":
                metrics[k].append(sums[k] / GLOBAL_PAIRS)
        metrics["lr"].append(step_lr)
        metrics["grad_norm"].append(norm)
        metrics["pairs"].append(GLOBAL_PAIRS)
    return metrics


def evaluate(P, ctx, case, pairs):
    """TRL's evaluation (the same loss and rewards, no gradients): means over the pairs."""
    sums = {k: 0.0 for k in ["eval_loss", "eval_rewards/chosen", "eval_rewards/rejected", "eval_rewards/margins",
                             "eval_rewards/accuracies", "eval_logps/chosen", "eval_logps/rejected"]}
    with torch.no_grad():
        for pair in pairs:
            loss, rc, rr, pc, pr = pair_terms(P, ctx, case, pair)
            for k, v in zip(sums, [loss.item(), rc, rr, rc - rr, 1.0 if rc > rr else 0.0, pc, pr]):
                sums[k] += v
    return {k: v / len(pairs) for k, v in sums.items()}


def job_yaml(case):
    lines = [
        f"name: golden-{case['name']}",
        "model:",
        "  path: ../llama_gqa/model",
        f"  quantization: {case['quant']['type'] if 'quant' in case else 'none'}",
    ]
    if "quant" in case:
        lines.append("  double_quant: true")
    lines += ["  dtype: fp32", "adapter:"]
    if case.get("full"):
        lines += ["  type: full"]
    else:
        lines += [
            "  type: lora",
            f"  r: {LORA['r']}",
            f"  alpha: {LORA['alpha']}",
            "  dropout: 0.0",
            f"  target_modules: [{', '.join(LORA['targets'])}]",
            "  init: ../llama_gqa/init_adapter",
        ]
    lines += [
        "data:",
        "  train: data.jsonl",
        "  eval: eval.jsonl",
        "  format: preference",
        f"  seq_len: {SEQ_LEN}",
        f"  max_prompt_len: {MAX_PROMPT}",
        "  packing: false",
        "  shuffle: false",
        "train:",
        "  objective: dpo",
        f"  dpo: {{beta: {case['beta']}, loss: {case['loss']}, label_smoothing: {case['label_smoothing']}"
        + (f", rpo_alpha: {case['rpo_alpha']}" if case.get("rpo_alpha") else "") + "}",
        f"  max_steps: {STEPS}",
        f"  global_batch_size: {GLOBAL_PAIRS}",
        f"  micro_batch_size: {MICRO_PAIRS}",
        f"  lr: {case['lr']}",
        "  lr_schedule: cosine",
        f"  warmup_steps: {g.WARMUP}",
        f"  weight_decay: {g.WEIGHT_DECAY}",
        f"  max_grad_norm: {case['max_grad_norm']}",
        "  seed: 42",
        "checkpoint:",
        "  every_steps: 1000",
        "resources:",
        "  device: cpu",
        "output:",
        "  dir: out",
    ]
    return "\n".join(lines) + "\n"


def run_case(case):
    m = g.LLAMA_GQA_MODEL
    gen = torch.Generator().manual_seed(1001)  # llama_gqa's seed: its weights and initial adapter
    w32 = g.make_base_weights(m, gen)
    P = g.base_params(dict(model=m, quant=case["quant"]) if "quant" in case else dict(model=m), w32)
    init = g.make_init_adapter(m, LORA, gen)
    if case.get("full"):  # every weight trained; the reference is a frozen copy of them
        ctx = {"model": m, "full": True, "bf16": False, "lora_scale": 0.0,
               "ref": {k: v.detach().clone() for k, v in P.items()}}
        trainable = {k: v.requires_grad_(True) for k, v in P.items()}
    else:
        ctx = {"model": m, "full": False, "bf16": False, "lora_scale": LORA["alpha"] / LORA["r"]}
        trainable = {k: v.to(g.F64).requires_grad_(True) for k, v in init.items()}
        P.update(trainable)
    out = os.path.join(g.HERE, case["name"])
    os.makedirs(os.path.join(out, "expected"), exist_ok=True)
    pairs = make_pairs(m["vocab_size"], torch.Generator().manual_seed(4242))
    pairs, eval_pairs = pairs[:N_PAIRS], pairs[N_PAIRS:]
    assert all(len(p["prompt_ids"]) <= MAX_PROMPT and
               len(p["prompt_ids"]) + max(len(p["chosen_ids"]), len(p["rejected_ids"])) <= SEQ_LEN for p in pairs)
    for name, rows in (("data.jsonl", pairs), ("eval.jsonl", eval_pairs)):
        with open(os.path.join(out, name), "w") as f:
            for p in rows:
                f.write(json.dumps(p) + "\n")
    g.write_text(os.path.join(out, "job.yaml"), job_yaml(case))
    metrics = train(P, ctx, case, trainable, pairs)
    clipped = [case["max_grad_norm"] / (n + 1e-6) < 1.0 for n in metrics["grad_norm"]]
    assert any(clipped) and not all(clipped), (case["name"], metrics["grad_norm"])
    metrics["max_grad_norm"] = case["max_grad_norm"]
    g.write_json(os.path.join(out, "expected", "metrics.json"), metrics)
    g.write_safetensors(os.path.join(out, "expected", "final.safetensors"), g.f32(trainable), "F32")
    g.write_json(os.path.join(out, "expected", "eval.json"), evaluate(P, ctx, case, eval_pairs))
    print(case["name"])
    for k in ["loss", "grad_norm", "rewards/margins", "rewards/accuracies"]:
        print(f"  {k:20s} {[round(x, 6) for x in metrics[k]]}")
    print(f"  clipped {clipped}")


def main():
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    for case in CASES:
        if not names or case["name"] in names:
            run_case(case)


if __name__ == "__main__":
    main()
