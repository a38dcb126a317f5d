#!/usr/bin/python3
"""PyTorch-eager baseline for bench/train_step_vs_torch.sh.

Times one LoRA training step (forward + backward + AdamW step + zero_grad) of a
Llama model in plain PyTorch, with the same shapes as ftune's `bench` preset:

    vocab 2048, hidden 256, intermediate 688, 4 layers, 8 heads, 4 kv heads,
    head_dim 32, rms eps 1e-5, rope theta 10000, untied lm_head,
    seq 256, batch 4, LoRA r=16 alpha=32 on q,k,v,o,gate,up,down, fp32.

The model is written from the Hugging Face LlamaForCausalLM definition (RMSNorm,
rotate_half RoPE, GQA causal attention, SwiGLU MLP) and PEFT's LoRA
(y = x W^T + (alpha/r) * (x A^T) B^T, base weights frozen).  Weights and data
are random: only the timing matters.

Attention: torch 1.13 has no torch.nn.functional.scaled_dot_product_attention,
so it is used when present and otherwise computed as matmul + causal mask +
softmax + matmul (what HF's "eager" attention does).  The script says which.

Prints one JSON line:
    {"median_step_s": ..., "tokens_per_s": ..., "attention": ..., ...}

Run with Debian's /usr/bin/python3 (torch 1.13); needs nothing but torch.
"""

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F

CFG = dict(vocab=2048, hidden=256, inter=688, layers=4, heads=8, kv_heads=4,
           head_dim=32, eps=1e-5, theta=10000.0)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12, help="steps to run (1-based)")
    ap.add_argument("--skip", type=int, default=2,
                    help="warm-up steps left out of the median (median over steps skip+1..steps)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phases", action="store_true",
                    help="also report median forward / backward / optimizer times")
    return ap.parse_args()


class LoRALinear(torch.nn.Module):
    """PEFT-style LoRA: frozen W (out, in); trainable A (r, in), B (out, r)."""

    def __init__(self, n_in, n_out, r, alpha, gen):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n_out, n_in, generator=gen) * 0.02,
                                         requires_grad=False)
        # PEFT initialises B to zero; use small random B so the LoRA path
        # does real work in every step (timing is identical either way).
        self.lora_A = torch.nn.Parameter(torch.randn(r, n_in, generator=gen) * (1.0 / math.sqrt(n_in)))
        self.lora_B = torch.nn.Parameter(torch.randn(n_out, r, generator=gen) * 0.01)
        self.scale = alpha / r

    def forward(self, x):
        return F.linear(x, self.weight) + self.scale * F.linear(F.linear(x, self.lora_A), self.lora_B)


def rms_norm(x, w, eps):
    # HF LlamaRMSNorm (computed in fp32, which x already is).
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, c, r, alpha, gen):
        super().__init__()
        H, I, hd = c["hidden"], c["inter"], c["head_dim"]
        qo, kvo = c["heads"] * hd, c["kv_heads"] * hd
        self.c = c
        self.input_layernorm = torch.nn.Parameter(torch.ones(H), requires_grad=False)
        self.post_attention_layernorm = torch.nn.Parameter(torch.ones(H), requires_grad=False)
        self.q_proj = LoRALinear(H, qo, r, alpha, gen)
        self.k_proj = LoRALinear(H, kvo, r, alpha, gen)
        self.v_proj = LoRALinear(H, kvo, r, alpha, gen)
        self.o_proj = LoRALinear(qo, H, r, alpha, gen)
        self.gate_proj = LoRALinear(H, I, r, alpha, gen)
        self.up_proj = LoRALinear(H, I, r, alpha, gen)
        self.down_proj = LoRALinear(I, H, r, alpha, gen)

    def forward(self, x, cos, sin, attn):
        c = self.c
        B, T, _ = x.shape
        nH, nKV, hd = c["heads"], c["kv_heads"], c["head_dim"]
        n = rms_norm(x, self.input_layernorm, c["eps"])
        q = self.q_proj(n).view(B, T, nH, hd).transpose(1, 2)
        k = self.k_proj(n).view(B, T, nKV, hd).transpose(1, 2)
        v = self.v_proj(n).view(B, T, nKV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # GQA as HF's repeat_kv: query head h uses kv head h // (nH / nKV).
        k = k.repeat_interleave(nH // nKV, dim=1)
        v = v.repeat_interleave(nH // nKV, dim=1)
        a = attn(q, k, v)                                   # [B, nH, T, hd]
        a = a.transpose(1, 2).reshape(B, T, nH * hd)
        h = x + self.o_proj(a)
        n = rms_norm(h, self.post_attention_layernorm, c["eps"])
        return h + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n))


class Llama(torch.nn.Module):
    def __init__(self, c, r, alpha, gen):
        super().__init__()
        self.c = c
        self.embed_tokens = torch.nn.Parameter(torch.randn(c["vocab"], c["hidden"], generator=gen) * 0.02,
                                               requires_grad=False)
        self.layers = torch.nn.ModuleList(Layer(c, r, alpha, gen) for _ in range(c["layers"]))
        self.norm = torch.nn.Parameter(torch.ones(c["hidden"]), requires_grad=False)
        self.lm_head = torch.nn.Parameter(torch.randn(c["vocab"], c["hidden"], generator=gen) * 0.02,
                                          requires_grad=False)

    def forward(self, ids, cos, sin, attn):
        x = F.embedding(ids, self.embed_tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, attn)
        x = rms_norm(x, self.norm, self.c["eps"])
        return F.linear(x, self.lm_head)


def rope_cos_sin(c, T):
    hd = c["head_dim"]
    inv_freq = 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()                             # [T, hd], broadcast over B, heads


def make_attention(T):
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return "sdpa", lambda q, k, v: sdpa(q, k, v, is_causal=True)
    mask = torch.full((T, T), float("-inf")).triu(1)        # additive causal mask, like HF eager

    def eager(q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + mask
        return torch.matmul(torch.softmax(s, dim=-1, dtype=torch.float32), v)
    return "matmul+softmax (torch %s has no F.scaled_dot_product_attention)" % torch.__version__, eager


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(a.seed)
    c = CFG
    model = Llama(c, a.r, a.alpha, gen)
    params = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    cos, sin = rope_cos_sin(c, a.seq)
    attn_name, attn = make_attention(a.seq)
    ids = torch.randint(0, c["vocab"], (a.batch, a.seq), generator=gen)
    labels = ids.clone()

    times, fwd, bwd, optt = [], [], [], []
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        logits = model(ids, cos, sin, attn)
        # HF causal-LM loss: predict token t+1 from position t, mean over B*(T-1).
        loss = F.cross_entropy(logits[:, :-1, :].reshape(-1, c["vocab"]), labels[:, 1:].reshape(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if step > a.skip:
            times.append(t3 - t0)
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            optt.append(t3 - t2)

    med = statistics.median(times)
    out = {
        "median_step_s": med,
        "tokens_per_s": a.batch * a.seq / med,
        "min_step_s": min(times),
        "steps_measured": len(times),
        "attention": attn_name,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "trainable_params": n_trainable,
        "last_loss": float(loss),
    }
    if a.phases:
        out.update(median_forward_s=statistics.median(fwd), median_backward_s=statistics.median(bwd),
                   median_optimizer_s=statistics.median(optt))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
