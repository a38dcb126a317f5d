#!/usr/bin/python3
"""Golden reference values for ftune (LoRA / full fine-tuning of Llama, Qwen2/3, Gemma 2/3).

What it makes
-------------
One folder per case under tests/golden/ (llama_gqa, qwen2_bias, tied_rslora,
llama_full, llama_qlora), each holding a tiny random Hugging Face style model,
a token data set, a job.yaml for ftune, the initial PEFT adapter (LoRA cases),
and the expected results computed here in float64 with plain PyTorch:

    <case>/model/config.json               HF config
    <case>/model/model.safetensors         (or two shards + model.safetensors.index.json)
    <case>/data.jsonl                      {"input_ids": [...]} per line
    <case>/job.yaml                        ftune job, paths relative to its folder
    <case>/init_adapter/adapter_config.json, adapter_model.safetensors   (LoRA cases)
    <case>/expected/metrics.json           loss / lr / grad_norm / tokens per step
    <case>/expected/grads_step1.safetensors  grads of the FIRST optimizer step (s = 0)
    <case>/expected/final.safetensors      trainable tensors after the last step
    <case>/expected/logits_seq0.safetensors  logits of data sequence 0 before training
    llama_qlora/expected/nf4_base.safetensors  its NF4-dequantized base linears (F32, HF names)

llama_qlora reuses llama_gqa's model/ and init_adapter/ (its job.yaml points
at ../llama_gqa/...) and trains on NF4-quantized base linears: the reference
replaces every q/k/v/o/gate/up/down weight by its NF4 + double-quant round
trip as computed by make_nf4_golden.py (bitsandbytes' algorithm).

See tests/golden/README.md for the exact semantics.

How to rerun
------------
    /usr/bin/python3 tests/golden/make_golden.py [case ...]

(case names: only those cases, e.g. gemma2 gemma2_full gemma2_qlora; a case that reuses
another's model must be named after it.)

(`--probe` instead trains every case without clipping and only prints the
grad norms; that is how the fixed max_grad_norm values in CASES were chosen.)

Needs only torch (tested with Debian's torch 1.13), numpy and the Python
standard library.  Everything is seeded; a rerun rewrites the same files byte
for byte.
The script also asserts a number of self-consistency checks (finite-difference
gradient check, padding invariance, llama3 RoPE regimes, clipping on some but
not all steps) and fails loudly if one does not hold.

The model code below is written from the Hugging Face definitions
(LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM / Gemma2ForCausalLM / Gemma3ForCausalLM /
Phi3ForCausalLM, PEFT
LoRA, HF Trainer's AdamW + cosine schedule + clip_grad_norm_) but is an independent
re-implementation.
"""

import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nf4_golden import nf4_roundtrip  # noqa: E402  (bitsandbytes' NF4, re-implemented)

torch.set_num_threads(1)  # deterministic reductions, and be gentle with the CPU
torch.use_deterministic_algorithms(True)

HERE = os.path.dirname(os.path.abspath(__file__))
F64 = torch.float64

# ----------------------------------------------------------------------------
# safetensors writing (the format is simple enough to write by hand)
# ----------------------------------------------------------------------------

ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def tensor_bytes(t, st_dtype):
    """Raw little-endian bytes of `t` rounded to `st_dtype` (round-to-nearest-even)."""
    t = t.detach().to(ST_DTYPES[st_dtype]).contiguous()
    if st_dtype == "F32":
        return t.numpy().astype("<f4").tobytes()
    if st_dtype == "F16":
        return t.numpy().astype("<f2").tobytes()
    # numpy has no bfloat16: reinterpret the 16-bit pattern as int16.
    return t.view(torch.int16).numpy().astype("<i2").tobytes()


def write_safetensors(path, tensors, st_dtype):
    """tensors: {name: tensor}. Names are written sorted, data in the same order."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        b = tensor_bytes(tensors[name], st_dtype)
        header[name] = {
            "dtype": st_dtype,
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(b)],
        }
        blobs.append(b)
        offset += len(b)
    header["__metadata__"] = {"format": "pt"}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # pad header to a multiple of 8
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)
    return offset  # number of data bytes


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(obj, indent=2) + "\n")


def write_text(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


# ----------------------------------------------------------------------------
# Case definitions
# ----------------------------------------------------------------------------

ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

LLAMA_GQA_MODEL = dict(
    model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500000.0,
    # NOTE: original_max_position_embeddings is 48, not 16.  With head_dim 16 the
    # shortest RoPE wavelength is 2*pi ~ 6.28; with orig 16 / high_freq_factor 4
    # the high-frequency cut-off would be 4 < 6.28 and *every* frequency would be
    # changed.  With 48: cut-offs are 12 (high) and 48 (low) -> wavelengths
    # 6.28 (kept), 32.4 (smoothed), 167+ (divided by factor): all three regimes.
    rope_scaling={"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                  "original_max_position_embeddings": 48, "rope_type": "llama3"},
    tie_word_embeddings=False, attention_bias=False, st_dtype="F32", shards=1,
)

# max_grad_norm of the Qwen3 cases (chosen with --probe: clipping on some steps, not all).
QWEN3_CLIP = {"qwen3_qknorm": 1.25, "qwen3_full": 3.2, "qwen3_qlora": 1.25}

# Qwen3 (Qwen3ForCausalLM): per-head RMSNorm of q and k before RoPE, head_dim 32 apart from
# hidden/heads (16), tied embeddings, bf16 on disk, as Qwen3-0.6B publishes its config.
QWEN3_MODEL = dict(
    model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=96,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, qk_norm=True,
    max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
    rope_scaling=None, tie_word_embeddings=True, attention_bias=False, st_dtype="BF16", shards=1,
)

# max_grad_norm of the Gemma 3 cases (chosen with --probe: clipping on some steps, not all).
GEMMA3_CLIP = {"gemma3_text": 1.7, "gemma3_full": 4.6, "gemma3_qlora": 1.7}

# Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text), as google/gemma-3-1b-pt publishes
# its config, sizes reduced.  Traits (each read with m.get, absent in the other models):
#   zero_centered_norm  Gemma RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), weights ~ N(0, 0.1)
#   sandwich_norm       post_attention_layernorm on the attention output, pre_/post_feedforward_layernorm
#                       around the MLP (four norms per layer)
#   embed_scale         embeddings multiplied by sqrt(hidden_size) (8 here); the tied head is not
#   hidden_act          gelu_pytorch_tanh instead of silu in the gated MLP
#   query_pre_attn_scalar  attention scores scaled by query_pre_attn_scalar ** -0.5 (not head_dim)
#   sliding_window_pattern layer i slides iff (i + 1) % pattern != 0; sliding layers mask keys
#                       j <= i - sliding_window and use RoPE base rope_local_base_freq, unscaled;
#                       full layers use rope_theta with rope_scaling (linear: inv_freq / factor)
GEMMA3_MODEL = dict(
    model_type="gemma3_text", vocab_size=256, hidden_size=64, intermediate_size=96,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32, qk_norm=True,
    zero_centered_norm=True, sandwich_norm=True, embed_scale=True, hidden_act="gelu_pytorch_tanh",
    query_pre_attn_scalar=24, sliding_window=64, sliding_window_pattern=2,
    rope_local_base_freq=10000.0,
    max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
    rope_scaling={"factor": 2.0, "rope_type": "linear"},
    tie_word_embeddings=True, attention_bias=False, st_dtype="BF16", shards=1,
)

# max_grad_norm of the Gemma 2 cases (chosen with --probe: clipping on some steps, not all).
GEMMA2_CLIP = {"gemma2": 1.2, "gemma2_full": 3.1, "gemma2_qlora": 1.2}

# Gemma 2 (Gemma2ForCausalLM), as google/gemma-2-2b publishes its config, sizes reduced: Gemma 3's
# norms, scales and activation without q/k norms, plus
#   attn_logit_softcapping   scores (after the scale) become cap * tanh(scores / cap) before the mask
#   final_logit_softcapping  the logits become cap * tanh(logits / cap) before the loss
#   sliding layers           alternating, the first sliding (HF: not layer_idx % 2; the config has no
#                            pattern key), one RoPE base for all; the window (6) is shorter than the
#                            sequences, so sliding layers do mask keys.
# The caps are far below the published 50 / 30 so that tanh bends this tiny model's scores
# (|s| up to ~1) and logits.
GEMMA2_MODEL = dict(
    model_type="gemma2", vocab_size=256, hidden_size=64, intermediate_size=96,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    zero_centered_norm=True, sandwich_norm=True, embed_scale=True, hidden_act="gelu_pytorch_tanh",
    query_pre_attn_scalar=24, sliding_window=6, sliding_window_pattern=2,
    attn_logit_softcapping=0.5, final_logit_softcapping=0.8,
    max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None,
    tie_word_embeddings=True, attention_bias=False, st_dtype="BF16", shards=1,
)


# max_grad_norm of the Phi-3 cases (chosen with --probe: clipping on some steps, not all).
PHI3_CLIP = {"phi3": 1.2, "phi3_full": 3.1, "phi3_qlora": 1.2}

# Phi-3 (Phi3ForCausalLM), as microsoft/Phi-3-mini-4k-instruct publishes its config, sizes reduced:
#   fused       one self_attn.qkv_proj (rows q, then k, then v) and one mlp.gate_up_proj (rows gate,
#               then up: HF's chunk(2)); PEFT's LoRA targets them by these names, one A and one B
#               for the fused output
#   partial_rotary_factor  RoPE turns the first head_dim * factor dims of each head (Phi-4-mini's
#               0.75; 0.5 here), frequencies over that many dims; the rest pass unchanged
#   sliding_window  every layer (shorter than the sequences here)
PHI3_MODEL = dict(
    model_type="phi3", vocab_size=256, hidden_size=64, intermediate_size=96,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, fused=True,
    partial_rotary_factor=0.5, sliding_window=10,
    max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
    tie_word_embeddings=False, attention_bias=False, st_dtype="BF16", shards=1,
)
PHI3_LINEARS = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]


def family_cases(lora, full, qlora, seed, model, clips):
    """A family's three cases: LoRA on all linears (6 steps), a full fine-tune of the same model
    (3 steps; its norms train, without decay) and QLoRA (NF4 + double quant) with the same LoRA;
    the last two reuse the first's model/ and init_adapter/."""
    targets = PHI3_LINEARS if model.get("fused") else ALL_LINEARS
    adapter = dict(type="lora", r=4, alpha=8, rslora=False, targets=targets)
    return [
        dict(name=lora, seed=seed, model=model, adapter=adapter, steps=6, lr=1e-2, max_grad_norm=clips[lora]),
        dict(name=full, seed=seed, model=model, reuse=lora, adapter=dict(type="full"),
             steps=3, lr=1e-3, max_grad_norm=clips[full]),
        dict(name=qlora, seed=seed, model=model, reuse=lora,
             quant=dict(type="nf4", block=64, double_quant=True, dq_block=256),
             adapter=adapter, steps=6, lr=1e-2, max_grad_norm=clips[qlora]),
    ]


CASES = [
    dict(name="llama_gqa", seed=1001, model=LLAMA_GQA_MODEL,
         adapter=dict(type="lora", r=4, alpha=8, rslora=False, targets=ALL_LINEARS),
         steps=6, lr=1e-2, max_grad_norm=1.5),
    dict(name="qwen2_bias", seed=2002,
         model=dict(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=96,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                    max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
                    rope_scaling=None, tie_word_embeddings=False, attention_bias=True,
                    st_dtype="BF16", shards=2),
         adapter=dict(type="lora", r=8, alpha=16, rslora=False, targets=["q_proj", "v_proj"]),
         steps=6, lr=1e-2, max_grad_norm=1.25),
    dict(name="tied_rslora", seed=3003,
         model=dict(model_type="llama", vocab_size=192, hidden_size=48, intermediate_size=112,
                    num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1,
                    max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                    rope_scaling=None, tie_word_embeddings=True, attention_bias=False,
                    st_dtype="F16", shards=1),
         adapter=dict(type="lora", r=4, alpha=8, rslora=True, targets=ALL_LINEARS),
         steps=6, lr=1e-2, max_grad_norm=2.5),
    # Same seed as llama_gqa: identical base weights and identical data.
    dict(name="llama_full", seed=1001, model=LLAMA_GQA_MODEL,
         adapter=dict(type="full"),
         steps=3, lr=1e-3, max_grad_norm=3.5),
    # QLoRA: llama_gqa's model, data and initial adapter (same seed; its model/
    # and init_adapter/ folders are reused, not copied), base linears NF4 with
    # double quantization (block 64, second-level block 256).
    dict(name="llama_qlora", seed=1001, model=LLAMA_GQA_MODEL, reuse="llama_gqa",
         quant=dict(type="nf4", block=64, double_quant=True, dq_block=256),
         adapter=dict(type="lora", r=4, alpha=8, rslora=False, targets=ALL_LINEARS),
         steps=6, lr=1e-2, max_grad_norm=1.6),
    # bf16 storage (model.dtype: bf16): llama_gqa's model, data and initial adapter, the
    # reference storing bf16 where the engine does (see BF16 STORAGE below), in float64 otherwise.
    dict(name="llama_bf16", seed=1001, model=LLAMA_GQA_MODEL, reuse="llama_gqa", compute="bf16",
         adapter=dict(type="lora", r=4, alpha=8, rslora=False, targets=ALL_LINEARS),
         steps=6, lr=1e-2, max_grad_norm=1.5),
    # Qwen3 and Gemma 3: LoRA, a full fine-tune (every norm trains too) and QLoRA of one model.
    *family_cases("qwen3_qknorm", "qwen3_full", "qwen3_qlora", 4004, QWEN3_MODEL, QWEN3_CLIP),
    *family_cases("gemma3_text", "gemma3_full", "gemma3_qlora", 5005, GEMMA3_MODEL, GEMMA3_CLIP),
    # Gemma 2: soft-capping and a window shorter than the sequences.
    *family_cases("gemma2", "gemma2_full", "gemma2_qlora", 6006, GEMMA2_MODEL, GEMMA2_CLIP),
    # Phi-3: fused projections, partial rotary, a window on every layer.
    *family_cases("phi3", "phi3_full", "phi3_qlora", 7007, PHI3_MODEL, PHI3_CLIP),
]

# Training settings shared by all cases.
SEQ_LEN = 32
N_SEQS = 24
MIN_LEN, MAX_LEN = 5, 32
GLOBAL_BATCH = 4
MICRO_BATCH = 2
WARMUP = 2
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def head_dim(m):
    return m.get("head_dim") or m["hidden_size"] // m["num_attention_heads"]


def is_sliding(m, i):
    """Gemma 2/3 (sliding_window_pattern, HF's older config form; Gemma 2's is 2): layer i is a
    sliding-window layer unless (i + 1) is a multiple of the pattern. Without a pattern every
    layer slides when the model has a window (Phi-3, Mistral), none otherwise."""
    pat = m.get("sliding_window_pattern")
    if pat is None:
        return m.get("sliding_window") is not None
    return (i + 1) % pat != 0


# ----------------------------------------------------------------------------
# Random weights, adapter init and data
# ----------------------------------------------------------------------------

def module_shapes(m):
    """(HF name, shape) of every linear in layer order: q,k,v,o,gate,up,down."""
    H, I, hd = m["hidden_size"], m["intermediate_size"], head_dim(m)
    q_out = m["num_attention_heads"] * hd
    kv_out = m["num_key_value_heads"] * hd
    if m.get("fused"):  # Phi-3
        return [("self_attn.qkv_proj", (q_out + 2 * kv_out, H)), ("self_attn.o_proj", (H, q_out)),
                ("mlp.gate_up_proj", (2 * I, H)), ("mlp.down_proj", (H, I))]
    return [("self_attn.q_proj", (q_out, H)), ("self_attn.k_proj", (kv_out, H)),
            ("self_attn.v_proj", (kv_out, H)), ("self_attn.o_proj", (H, q_out)),
            ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)), ("mlp.down_proj", (H, I))]


def make_base_weights(m, gen):
    """HF-named float32 tensors, generated in a fixed order."""
    def normal(shape, std):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std

    H, V = m["hidden_size"], m["vocab_size"]
    # Norm weights scatter around 1, or around 0 for Gemma's zero-centred (1 + w) norms.
    one = 0.0 if m.get("zero_centered_norm") else 1.0
    w = {"model.embed_tokens.weight": normal((V, H), 0.05)}
    for i in range(m["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = one + normal((H,), 0.1)
        for mod, shape in module_shapes(m):
            w[p + mod + ".weight"] = normal(shape, 0.05)
            if m["attention_bias"] and mod in ("self_attn.q_proj", "self_attn.k_proj",
                                               "self_attn.v_proj"):
                w[p + mod + ".bias"] = normal((shape[0],), 0.05)
        if m.get("qk_norm"):
            w[p + "self_attn.q_norm.weight"] = one + normal((head_dim(m),), 0.1)
            w[p + "self_attn.k_norm.weight"] = one + normal((head_dim(m),), 0.1)
        w[p + "post_attention_layernorm.weight"] = one + normal((H,), 0.1)
        if m.get("sandwich_norm"):
            w[p + "pre_feedforward_layernorm.weight"] = one + normal((H,), 0.1)
            w[p + "post_feedforward_layernorm.weight"] = one + normal((H,), 0.1)
    w["model.norm.weight"] = one + normal((H,), 0.1)
    if not m["tie_word_embeddings"]:
        w["lm_head.weight"] = normal((V, H), 0.05)
    return w


def round_to_storage(w, st_dtype):
    """The values the C++ engine will read from disk, as float64."""
    return {k: v.to(ST_DTYPES[st_dtype]).to(F64) for k, v in w.items()}


def is_base_linear(name):
    """q/k/v/o/gate/up/down weights of every layer (not embeddings, norms, lm_head)."""
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


def base_params(case, w32):
    """The float64 base weights the reference computes with: the stored values,
    and for an NF4 case the base linears replaced by their NF4 round trip
    (each weight flattened row-major and quantized as one vector); a bf16
    compute case rounds every base weight to bf16, as the engine stores it."""
    m = case["model"]
    P = round_to_storage(w32, m["st_dtype"])
    if case.get("compute") == "bf16":
        P = {k: to_bf16(v) for k, v in P.items()}
    q = case.get("quant")
    if q is None:
        return P
    assert q["type"] == "nf4"
    for k in P:
        if is_base_linear(k):
            stored = w32[k].to(ST_DTYPES[m["st_dtype"]]).to(torch.float32)
            deq = nf4_roundtrip(stored.reshape(-1).numpy(), q["block"], q["double_quant"], q["dq_block"])
            P[k] = torch.from_numpy(deq).reshape(stored.shape).to(F64)
    return P


def lora_key(hf_module, which):
    # PEFT's saved names: base_model.model.<HF module path>.lora_A.weight
    return f"base_model.model.{hf_module}.lora_{which}.weight"


def make_init_adapter(m, ad, gen):
    """PEFT-named float32 LoRA tensors, A ~ U(-0.2, 0.2), B ~ N(0, 0.05)."""
    r = ad["r"]
    out = {}
    for i in range(m["num_hidden_layers"]):
        for mod, (o, n) in module_shapes(m):
            if mod.split(".")[1] not in ad["targets"]:
                continue
            hf = f"model.layers.{i}.{mod}"
            out[lora_key(hf, "A")] = torch.rand((r, n), generator=gen, dtype=torch.float32) * 0.4 - 0.2
            out[lora_key(hf, "B")] = torch.randn((o, r), generator=gen, dtype=torch.float32) * 0.05
    return out


def make_data(vocab, gen):
    """N_SEQS random sequences, lengths uniform in [MIN_LEN, MAX_LEN], ids in 1..vocab-1.

    Purely uniform ids cannot be learned (loss stays at ~ln(vocab)), so the ids
    are skewed to make the loss visibly fall: each token is, with probability
    3/4, one of 16 "frequent" ids (a fixed random subset), otherwise uniform
    over 1..vocab-1.
    """
    frequent = (torch.randperm(vocab - 1, generator=gen)[:16] + 1).tolist()
    lens = torch.randint(MIN_LEN, MAX_LEN + 1, (N_SEQS,), generator=gen).tolist()
    data = []
    for n in lens:
        pick = torch.rand(n, generator=gen, dtype=F64) < 0.75
        freq_ids = torch.randint(0, len(frequent), (n,), generator=gen).tolist()
        any_ids = torch.randint(1, vocab, (n,), generator=gen).tolist()
        data.append([frequent[f] if p else a for p, f, a in zip(pick.tolist(), freq_ids, any_ids)])
    return data


# ----------------------------------------------------------------------------
# The model (float64)
# ----------------------------------------------------------------------------

def rotary_dim(m):
    """The dims of a head RoPE turns: all, or head_dim * partial_rotary_factor (Phi-3/4)."""
    return int(head_dim(m) * m.get("partial_rotary_factor", 1.0))


def rope_inv_freq(m, local=False):
    """HF default RoPE frequencies, optionally rescaled with the llama3 rule or the linear one
    (inv_freq / factor).  local: Gemma 3's sliding-window layers, base rope_local_base_freq
    and no scaling (HF's rotary_emb_local: rope_type "default")."""
    hd = rotary_dim(m)
    theta = m["rope_local_base_freq"] if local else m["rope_theta"]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=F64) / hd))
    rs = None if local else m["rope_scaling"]
    if rs is None:
        return inv_freq
    if rs["rope_type"] == "linear":
        return inv_freq / rs["factor"]
    assert rs["rope_type"] == "llama3"
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    orig = rs["original_max_position_embeddings"]
    low_freq_wavelen = orig / low
    high_freq_wavelen = orig / high
    out = []
    for f in inv_freq.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_freq_wavelen:          # high frequency: unchanged
            out.append(f)
        elif wavelen > low_freq_wavelen:         # low frequency: divided by factor
            out.append(f / factor)
        else:                                    # in between: smooth interpolation
            smooth = (orig / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=F64)


def rope_cos_sin(m, T, local=False):
    inv_freq = rope_inv_freq(m, local)
    pos = torch.arange(T, dtype=F64)
    freqs = pos[:, None] * inv_freq[None, :]        # [T, hd/2]
    emb = torch.cat([freqs, freqs], dim=-1)         # [T, hd]
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, cos, sin):
    """HF's apply_rotary_pos_emb on the first cos.shape[-1] dims of each head, the rest passed
    (Phi-3's partial rotary; every dim otherwise)."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], dim=-1)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def norm_weight(P, m, name):
    """The factor an RMSNorm multiplies by: its weight, or 1 + weight for Gemma's zero-centred norms."""
    return 1.0 + P[name] if m.get("zero_centered_norm") else P[name]


def gelu_tanh(x):
    """gelu_pytorch_tanh (Gemma 3's hidden_activation)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


# ----------------------------------------------------------------------------
# BF16 STORAGE: where a bf16 run of the engine stores bf16 (docs/ENGINE.md,
# "Precision"). Arithmetic stays float64 here; a value is rounded to bf16
# (round-to-nearest-even, through float32 as the engine's fp32 results are)
# where the engine stores it:
#   stored(x)   a stored activation: x rounded, and its gradient rounded too
#               (the engine's fp32 gradient workspaces are rounded at the
#               same tensors);
#   attention   FlashAttention-2's backward (_FlashAttention: D from the
#               stored output);
#   operand(x)  rounded in the forward only: a GEMM operand taken as bf16
#               (LoRA's fp32 masters A and B) or a value rounded where its
#               gradient is not (q and k after RoPE: the engine rounds their
#               gradients before the inverse rotation; a linear's output
#               before its residual add).
# fp32 cases use neither (identity).
# ----------------------------------------------------------------------------

def to_bf16(x):
    return x.to(torch.float32).to(torch.bfloat16).to(x.dtype)


def _bf16_rounding(round_gradient):
    """An autograd op rounding its input to bf16, and its gradient too when asked."""
    class Round(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return to_bf16(x)

        @staticmethod
        def backward(ctx, g):
            return to_bf16(g) if round_gradient else g
    return Round


_Stored = _bf16_rounding(True)
_Operand = _bf16_rounding(False)


class _FlashAttention(torch.autograd.Function):
    """Softmax attention whose backward is FlashAttention-2's, as the engine
    computes it: D_i = dO_i · O_i from the STORED (bf16) output O, so dS =
    P ∘ (dP - D) carries O's rounding (dV = Pᵀ dO does not)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        p = torch.softmax(((q @ k.transpose(-1, -2)) * scale).masked_fill(causal, float("-inf")), dim=-1)
        out = p @ v
        ctx.save_for_backward(q, k, v, p, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, p, out = ctx.saved_tensors
        dv = p.transpose(-1, -2) @ dout
        delta = (dout * to_bf16(out)).sum(-1, keepdim=True)
        ds = p * (dout @ v.transpose(-1, -2) - delta) * ctx.scale
        return ds @ k, ds.transpose(-1, -2) @ q, dv, None, None


def stored(ctx, x):
    return _Stored.apply(x) if ctx["bf16"] else x


def operand(ctx, x):
    return _Operand.apply(x) if ctx["bf16"] else x


def linear(P, ctx, hf_module, x):
    """Base linear (+ bias) plus the PEFT LoRA branch if the module is targeted
    (bf16: A and B taken as bf16 operands, x·Aᵀ stored)."""
    y = x @ P[hf_module + ".weight"].T
    if hf_module + ".bias" in P:
        y = y + P[hf_module + ".bias"]
    a = lora_key(hf_module, "A")
    if a in P:
        xa = stored(ctx, x @ operand(ctx, P[a]).T)
        y = y + ctx["lora_scale"] * (xa @ operand(ctx, P[lora_key(hf_module, "B")]).T)
    return y


def forward(P, ctx, ids):
    """ids: LongTensor [B, T] -> logits [B, T, V].  Causal only, no padding mask:
    with right padding, real positions never attend to (later) pad positions."""
    m = ctx["model"]
    B, T = ids.shape
    nH, nKV, hd = m["num_attention_heads"], m["num_key_value_heads"], head_dim(m)
    eps = m["rms_norm_eps"]
    cos, sin = rope_cos_sin(m, T)                   # position ids 0..T-1 per row
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    if m.get("sliding_window") is not None:
        # Sliding layers (all of Phi-3's, Gemma's by pattern): keys j <= i - sliding_window masked
        # too (HF: a query at i attends to j in (i - sliding_window, i]); Gemma 3's use a local RoPE base.
        cos_local, sin_local = rope_cos_sin(m, T, local=m.get("rope_local_base_freq") is not None)
        window = causal | torch.ones(T, T, dtype=torch.bool).tril(-m["sliding_window"])

    x = P["model.embed_tokens.weight"][ids]
    if m.get("embed_scale"):  # Gemma3TextScaledWordEmbedding (the tied head uses the plain weight)
        x = x * math.sqrt(m["hidden_size"])
    x = stored(ctx, x)
    for i in range(m["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if is_sliding(m, i):
            cos_i, sin_i, mask = cos_local, sin_local, window
        else:
            cos_i, sin_i, mask = cos, sin, causal
        n = stored(ctx, rms_norm(x, norm_weight(P, m, p + "input_layernorm.weight"), eps))
        if m.get("fused"):  # Phi-3: q, k and v are column blocks of one projection
            qkv = stored(ctx, linear(P, ctx, p + "self_attn.qkv_proj", n))
            q, k, v = qkv.split([nH * hd, nKV * hd, nKV * hd], dim=-1)
            q, k = q.reshape(B, T, nH, hd), k.reshape(B, T, nKV, hd)
        else:
            q = stored(ctx, linear(P, ctx, p + "self_attn.q_proj", n)).view(B, T, nH, hd)
            k = stored(ctx, linear(P, ctx, p + "self_attn.k_proj", n)).view(B, T, nKV, hd)
        if m.get("qk_norm"):  # Qwen3/Gemma3 attention: q_norm / k_norm over each head's hd values, before RoPE
            q = stored(ctx, rms_norm(q, norm_weight(P, m, p + "self_attn.q_norm.weight"), eps))
            k = stored(ctx, rms_norm(k, norm_weight(P, m, p + "self_attn.k_norm.weight"), eps))
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        if m.get("fused"):
            v = v.reshape(B, T, nKV, hd).transpose(1, 2)
        else:
            v = stored(ctx, linear(P, ctx, p + "self_attn.v_proj", n)).view(B, T, nKV, hd).transpose(1, 2)
        q = operand(ctx, apply_rope(q, cos_i, sin_i))
        k = operand(ctx, apply_rope(k, cos_i, sin_i))
        # GQA: query head h uses kv head h // (nH / nKV).
        k = k.repeat_interleave(nH // nKV, dim=1)
        v = v.repeat_interleave(nH // nKV, dim=1)
        qpas = m.get("query_pre_attn_scalar")
        cap = m.get("attn_logit_softcapping")
        if ctx["bf16"]:
            assert cap is None  # _FlashAttention has no soft-cap
            a = _FlashAttention.apply(q, k, v, mask, 1.0 / math.sqrt(hd) if qpas is None else qpas ** -0.5)
        else:
            if qpas is None:
                s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            else:                                   # Gemma: scaling = query_pre_attn_scalar ** -0.5
                s = (q @ k.transpose(-1, -2)) * qpas ** -0.5
            if cap is not None:                     # Gemma 2: soft-capped before the mask
                s = cap * torch.tanh(s / cap)
            s = s.masked_fill(mask, float("-inf"))
            a = torch.softmax(s, dim=-1) @ v        # [B, nH, T, hd]
        a = stored(ctx, a.transpose(1, 2).reshape(B, T, nH * hd))
        if m.get("sandwich_norm"):
            # Gemma 3: x + post_attention_layernorm(attn), then
            # h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))).
            o = stored(ctx, linear(P, ctx, p + "self_attn.o_proj", a))
            h = stored(ctx, x + rms_norm(o, norm_weight(P, m, p + "post_attention_layernorm.weight"), eps))
            n = stored(ctx, rms_norm(h, norm_weight(P, m, p + "pre_feedforward_layernorm.weight"), eps))
        else:
            h = stored(ctx, x + operand(ctx, linear(P, ctx, p + "self_attn.o_proj", a)))
            n = stored(ctx, rms_norm(h, norm_weight(P, m, p + "post_attention_layernorm.weight"), eps))
        if m.get("fused"):  # Phi-3: gate, then up (HF's chunk(2))
            g, u = stored(ctx, linear(P, ctx, p + "mlp.gate_up_proj", n)).chunk(2, dim=-1)
        else:
            g = stored(ctx, linear(P, ctx, p + "mlp.gate_proj", n))
            u = stored(ctx, linear(P, ctx, p + "mlp.up_proj", n))
        if m.get("hidden_act", "silu") == "silu":
            act = stored(ctx, F.silu(g) * u)
        else:
            assert m["hidden_act"] == "gelu_pytorch_tanh"
            act = stored(ctx, gelu_tanh(g) * u)
        if m.get("sandwich_norm"):
            d = stored(ctx, linear(P, ctx, p + "mlp.down_proj", act))
            x = stored(ctx, h + rms_norm(d, norm_weight(P, m, p + "post_feedforward_layernorm.weight"), eps))
        else:
            x = stored(ctx, h + operand(ctx, linear(P, ctx, p + "mlp.down_proj", act)))
    x = stored(ctx, rms_norm(x, norm_weight(P, m, "model.norm.weight"), eps))
    head = P["model.embed_tokens.weight"] if m["tie_word_embeddings"] else P["lm_head.weight"]
    logits = stored(ctx, x @ head.T)  # bf16: logits rounded, their gradient taken as a bf16 operand
    cap = m.get("final_logit_softcapping")
    return logits if cap is None else cap * torch.tanh(logits / cap)  # Gemma 2


def make_micro_batch(seqs):
    """Right-pad with id 0; targets are the next token, -100 on padding / last token."""
    T = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    tgt = torch.full((len(seqs), T), -100, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s)
        tgt[b, :len(s) - 1] = torch.tensor(s[1:])
    return ids, tgt


def loss_sum(P, ctx, seqs):
    ids, tgt = make_micro_batch(seqs)
    logits = forward(P, ctx, ids)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                           ignore_index=-100, reduction="sum")


# ----------------------------------------------------------------------------
# Training (HF Trainer semantics)
# ----------------------------------------------------------------------------

def lr_mult(s, total):
    """transformers.get_cosine_schedule_with_warmup, num_cycles = 0.5."""
    if s < WARMUP:
        return s / max(1, WARMUP)
    progress = (s - WARMUP) / max(1, total - WARMUP)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * 0.5 * progress)))


def train(P, ctx, trainable, data, steps, lr, max_grad_norm):
    """trainable: {name: leaf tensor in P}.  Returns metrics and step-0 grads."""
    names = list(trainable)
    if ctx["full"]:
        # HF Trainer: no weight decay for biases and (any) norm weights.
        def no_decay(n):
            return n.endswith(".bias") or "norm" in n
        groups = [
            {"params": [trainable[n] for n in names if not no_decay(n)], "weight_decay": WEIGHT_DECAY},
            {"params": [trainable[n] for n in names if no_decay(n)], "weight_decay": 0.0},
        ]
    else:
        groups = [{"params": [trainable[n] for n in names], "weight_decay": WEIGHT_DECAY}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=BETAS, eps=ADAM_EPS, weight_decay=WEIGHT_DECAY)
    params = [trainable[n] for n in names]

    metrics = {"loss": [], "lr": [], "grad_norm": [], "tokens": []}
    grads0 = None
    for s in range(steps):
        batch = data[s * GLOBAL_BATCH:(s + 1) * GLOBAL_BATCH]
        n_tok = sum(len(x) - 1 for x in batch)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in range(0, GLOBAL_BATCH, MICRO_BATCH):
            ls = loss_sum(P, ctx, batch[mb:mb + MICRO_BATCH])
            (ls / n_tok).backward()               # normalised by the GLOBAL token count
            total += ls.item()
        if s == 0:
            grads0 = {n: trainable[n].grad.detach().clone() for n in names}
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm).item()  # pre-clip norm
        step_lr = lr * lr_mult(s, steps)
        for g in opt.param_groups:
            g["lr"] = step_lr
        opt.step()
        metrics["loss"].append(total / n_tok)
        metrics["lr"].append(step_lr)
        metrics["grad_norm"].append(norm)
        metrics["tokens"].append(n_tok)
    return metrics, grads0


# ----------------------------------------------------------------------------
# Output files
# ----------------------------------------------------------------------------

GEMMA3_CONFIG_KEYS = [  # google/gemma-3-1b-pt's config.json keys, in its (sorted) order
    "architectures", "attention_bias", "attention_dropout", "attn_logit_softcapping", "bos_token_id",
    "cache_implementation", "eos_token_id", "final_logit_softcapping", "head_dim", "hidden_activation",
    "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings", "model_type",
    "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
    "query_pre_attn_scalar", "rms_norm_eps", "rope_local_base_freq", "rope_scaling", "rope_theta",
    "sliding_window", "sliding_window_pattern", "tie_word_embeddings", "torch_dtype",
    "transformers_version", "use_cache", "vocab_size",
]


def gemma_config(m, architecture, keys, **published):
    """config.json of a Gemma model with the keys its model card publishes (`keys`, in order),
    sizes reduced; `published` overrides (eos, transformers_version)."""
    values = {
        "architectures": [architecture],
        "attention_bias": m["attention_bias"],
        "attention_dropout": 0.0,
        "attn_logit_softcapping": m.get("attn_logit_softcapping"),
        "bos_token_id": 2,
        "cache_implementation": "hybrid",
        "final_logit_softcapping": m.get("final_logit_softcapping"),
        "head_dim": head_dim(m),
        "hidden_act": m["hidden_act"],
        "hidden_activation": m["hidden_act"],
        "hidden_size": m["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": m["intermediate_size"],
        "max_position_embeddings": m["max_position_embeddings"],
        "model_type": m["model_type"],
        "num_attention_heads": m["num_attention_heads"],
        "num_hidden_layers": m["num_hidden_layers"],
        "num_key_value_heads": m["num_key_value_heads"],
        "pad_token_id": 0,
        "query_pre_attn_scalar": m["query_pre_attn_scalar"],
        "rms_norm_eps": m["rms_norm_eps"],
        "rope_local_base_freq": m.get("rope_local_base_freq"),
        "rope_scaling": m["rope_scaling"],
        "rope_theta": m["rope_theta"],
        "sliding_window": m["sliding_window"],
        "sliding_window_pattern": m.get("sliding_window_pattern"),
        "tie_word_embeddings": m["tie_word_embeddings"],
        "torch_dtype": {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[m["st_dtype"]],
        "use_cache": True,
        "vocab_size": m["vocab_size"],
    }
    values.update(published)
    return {key: values[key] for key in keys}


def gemma3_config(m):
    """config.json as google/gemma-3-1b-pt publishes it, sizes reduced (bos 2, eos 1, pad 0)."""
    return gemma_config(m, "Gemma3ForCausalLM", GEMMA3_CONFIG_KEYS, eos_token_id=1,
                        transformers_version="4.50.0.dev0")


GEMMA2_CONFIG_KEYS = [  # google/gemma-2-2b's config.json keys, in its (sorted) order
    "architectures", "attention_bias", "attention_dropout", "attn_logit_softcapping", "bos_token_id",
    "cache_implementation", "eos_token_id", "final_logit_softcapping", "head_dim", "hidden_act",
    "hidden_activation", "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
    "model_type", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
    "query_pre_attn_scalar", "rms_norm_eps", "rope_theta", "sliding_window", "torch_dtype",
    "transformers_version", "use_cache", "vocab_size",
]


def gemma2_config(m):
    """config.json as google/gemma-2-2b publishes it, sizes reduced (bos 2, eos [1, 107] with 107
    out of this vocabulary replaced by 3, pad 0). No layer_types or pattern key: transformers
    4.42 alternates the layers itself."""
    assert m["sliding_window_pattern"] == 2
    return gemma_config(m, "Gemma2ForCausalLM", GEMMA2_CONFIG_KEYS, eos_token_id=[1, 3],
                        transformers_version="4.42.4")


PHI3_CONFIG_KEYS = [  # microsoft/Phi-3-mini-4k-instruct's config.json keys, in its order
    "_name_or_path", "architectures", "attention_dropout", "auto_map", "bos_token_id", "embd_pdrop",
    "eos_token_id", "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
    "max_position_embeddings", "model_type", "num_attention_heads", "num_hidden_layers",
    "num_key_value_heads", "original_max_position_embeddings", "pad_token_id", "partial_rotary_factor",
    "resid_pdrop", "rms_norm_eps", "rope_scaling", "rope_theta", "sliding_window", "tie_word_embeddings",
    "torch_dtype", "transformers_version", "use_cache", "attention_bias", "vocab_size",
]


def phi3_config(m):
    """config.json as microsoft/Phi-3-mini-4k-instruct publishes it, sizes reduced (eos/pad 32000
    out of this vocabulary replaced by 3), partial_rotary_factor as Phi-4-mini has the key."""
    cfg = {
        "_name_or_path": "Phi-3-mini-4k-instruct",
        "architectures": ["Phi3ForCausalLM"],
        "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
                     "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
        "bos_token_id": 1,
        "embd_pdrop": 0.0,
        "eos_token_id": 3,
        "hidden_act": "silu",
        "hidden_size": m["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": m["intermediate_size"],
        "max_position_embeddings": m["max_position_embeddings"],
        "model_type": "phi3",
        "num_attention_heads": m["num_attention_heads"],
        "num_hidden_layers": m["num_hidden_layers"],
        "num_key_value_heads": m["num_key_value_heads"],
        "original_max_position_embeddings": m["max_position_embeddings"],
        "pad_token_id": 3,
        "partial_rotary_factor": m["partial_rotary_factor"],
        "resid_pdrop": 0.0,
        "rms_norm_eps": m["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": m["rope_theta"],
        "sliding_window": m["sliding_window"],
        "tie_word_embeddings": m["tie_word_embeddings"],
        "torch_dtype": {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[m["st_dtype"]],
        "transformers_version": "4.40.2",
        "use_cache": True,
        "attention_bias": False,
        "vocab_size": m["vocab_size"],
    }
    assert list(cfg) == PHI3_CONFIG_KEYS
    return cfg


def hf_config(m):
    if m["model_type"] == "phi3":
        return phi3_config(m)
    if m["model_type"] == "gemma3_text":
        return gemma3_config(m)
    if m["model_type"] == "gemma2":
        return gemma2_config(m)
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[m["model_type"]]
    cfg = {
        "architectures": [arch],
        "model_type": m["model_type"],
        "vocab_size": m["vocab_size"],
        "hidden_size": m["hidden_size"],
        "intermediate_size": m["intermediate_size"],
        "num_hidden_layers": m["num_hidden_layers"],
        "num_attention_heads": m["num_attention_heads"],
        "num_key_value_heads": m["num_key_value_heads"],
        "head_dim": head_dim(m),
        "max_position_embeddings": m["max_position_embeddings"],
        "rms_norm_eps": m["rms_norm_eps"],
        "rope_theta": m["rope_theta"],
        "rope_scaling": m["rope_scaling"],
        "tie_word_embeddings": m["tie_word_embeddings"],
        "torch_dtype": {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[m["st_dtype"]],
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if m["model_type"] == "llama":
        cfg["attention_bias"] = False   # Qwen2's config has no such key: q/k/v bias is implied
        cfg["mlp_bias"] = False
    elif m["model_type"] == "qwen3":    # as Qwen3-0.6B's config.json has them
        cfg["attention_bias"] = False
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = None
        cfg["max_window_layers"] = m["num_hidden_layers"]
    else:
        cfg["use_sliding_window"] = False
    return cfg


def write_model(folder, m, weights32):
    write_json(os.path.join(folder, "config.json"), hf_config(m))
    st = m["st_dtype"]
    if m["shards"] == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), weights32, st)
        return
    # Two shards: embeddings + layer 0 in the first, the rest in the second.
    first = {k: v for k, v in weights32.items()
             if k.startswith("model.embed_tokens.") or k.startswith("model.layers.0.")}
    second = {k: v for k, v in weights32.items() if k not in first}
    weight_map = {}
    total = 0
    for idx, part in enumerate([first, second], start=1):
        fname = f"model-{idx:05d}-of-00002.safetensors"
        total += write_safetensors(os.path.join(folder, fname), part, st)
        for k in part:
            weight_map[k] = fname
    write_json(os.path.join(folder, "model.safetensors.index.json"),
               {"metadata": {"total_size": total},
                "weight_map": {k: weight_map[k] for k in sorted(weight_map)}})


def adapter_config(ad):
    return {
        "alpha_pattern": {},
        "base_model_name_or_path": "model",
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layers_pattern": None,
        "layers_to_transform": None,
        "lora_alpha": ad["alpha"],
        "lora_dropout": 0.0,
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": ad["r"],
        "rank_pattern": {},
        "revision": None,
        "target_modules": list(ad["targets"]),
        "task_type": "CAUSAL_LM",
        "use_rslora": ad["rslora"],
    }


def job_yaml(case):
    ad = case["adapter"]
    shared = f"../{case['reuse']}/" if "reuse" in case else ""   # model/ and init_adapter/ of another case
    lines = [
        f"name: golden-{case['name']}",
        "model:",
        f"  path: {shared}model",
    ]
    if "quant" in case:
        lines += [
            f"  quantization: {case['quant']['type']}",
            f"  double_quant: {'true' if case['quant']['double_quant'] else 'false'}",
        ]
    else:
        lines += ["  quantization: none"]
    lines += [
        f"  dtype: {case.get('compute', 'fp32')}",
        "adapter:",
        f"  type: {ad['type']}",
    ]
    if ad["type"] == "lora":
        lines += [
            f"  r: {ad['r']}",
            f"  alpha: {ad['alpha']}",
            "  dropout: 0.0",
            f"  rslora: {'true' if ad['rslora'] else 'false'}",
            f"  target_modules: [{', '.join(ad['targets'])}]",
            f"  init: {shared}init_adapter",
        ]
    lines += [
        "data:",
        "  train: data.jsonl",
        "  format: tokens",
        f"  seq_len: {SEQ_LEN}",
        "  packing: false",
        "  shuffle: false",
        "train:",
        f"  max_steps: {case['steps']}",
        f"  global_batch_size: {GLOBAL_BATCH}",
        f"  micro_batch_size: {MICRO_BATCH}",
        f"  gradient_accumulation: {GLOBAL_BATCH // MICRO_BATCH}",
        f"  lr: {case['lr']}",
        "  lr_schedule: cosine",
        f"  warmup_steps: {WARMUP}",
        f"  weight_decay: {WEIGHT_DECAY}",
        f"  max_grad_norm: {case['max_grad_norm']}",
        "  optimizer: adamw",
        "  seed: 42",
        "  activation_checkpointing: false",
        "  attention: flash",
        "checkpoint:",
        "  every_steps: 1000",
        "  keep: 1",
        "resources:",
        "  device: cpu",
        "output:",
        "  dir: out",
        "  merge: false",
    ]
    return "\n".join(lines) + "\n"


def f32(d):
    return {k: v.detach().to(torch.float32) for k, v in d.items()}


# ----------------------------------------------------------------------------
# Self-checks
# ----------------------------------------------------------------------------

def check_llama3_regimes(m):
    base = 1.0 / (m["rope_theta"] ** (torch.arange(0, head_dim(m), 2, dtype=F64) / head_dim(m)))
    scaled = rope_inv_freq(m)
    f = m["rope_scaling"]["factor"]
    same = int((scaled == base).sum())
    divided = int(torch.isclose(scaled, base / f, rtol=1e-12, atol=0).sum())
    smoothed = len(base) - same - divided
    assert same >= 1 and divided >= 1 and smoothed >= 1, (same, smoothed, divided)
    return same, smoothed, divided


def check_local_global(m):
    """Gemma 3: both layer kinds present, and their RoPE frequencies as stated."""
    hd = head_dim(m)
    kinds = {is_sliding(m, i) for i in range(m["num_hidden_layers"])}
    assert kinds == {True, False}, kinds
    exps = torch.arange(0, hd, 2, dtype=F64) / hd
    assert m["rope_scaling"]["rope_type"] == "linear"
    assert torch.equal(rope_inv_freq(m), (1.0 / m["rope_theta"] ** exps) / m["rope_scaling"]["factor"])
    assert torch.equal(rope_inv_freq(m, local=True), 1.0 / m["rope_local_base_freq"] ** exps)


def check_padding_invariance(P, ctx, data):
    """Sequence 0 alone must give the same logits as inside a padded micro-batch."""
    with torch.no_grad():
        alone = forward(P, ctx, torch.tensor([data[0]]))[0]
        ids, _ = make_micro_batch(data[:MICRO_BATCH])
        batched = forward(P, ctx, ids)[0, :len(data[0])]
    assert torch.allclose(alone, batched, rtol=1e-10, atol=1e-12)


def check_finite_difference(P, ctx, trainable, grads0, data):
    """Central differences on a few entries of the step-0 loss vs autograd."""
    batch = data[:GLOBAL_BATCH]
    n_tok = sum(len(x) - 1 for x in batch)

    def loss():
        with torch.no_grad():
            return sum(loss_sum(P, ctx, batch[i:i + MICRO_BATCH]).item()
                       for i in range(0, GLOBAL_BATCH, MICRO_BATCH)) / n_tok

    names = sorted(trainable)
    picks = [names[0], names[len(names) // 2], names[-1]]
    h = 1e-6
    for n in picks:
        t = trainable[n]
        # the entry with the largest gradient of this tensor
        idx = tuple(_unravel(int(grads0[n].abs().flatten().argmax()), t.shape))
        with torch.no_grad():
            old = t[idx].item()
            t[idx] = old + h
            lp = loss()
            t[idx] = old - h
            lm = loss()
            t[idx] = old
        fd = (lp - lm) / (2 * h)
        ad = grads0[n][idx].item()
        assert abs(fd - ad) <= 1e-6 * max(1.0, abs(ad)), (n, fd, ad)


def _unravel(flat, shape):
    out = []
    for d in reversed(shape):
        out.append(flat % d)
        flat //= d
    return list(reversed(out))


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------

def run_case(case):
    m, ad = case["model"], case["adapter"]
    out = os.path.join(HERE, case["name"])
    gen = torch.Generator().manual_seed(case["seed"])

    # Base weights: generate in f32, round to the storage dtype, compute on those
    # (NF4 cases: on their NF4 round trip).
    w32 = make_base_weights(m, gen)
    reuse = case.get("reuse")
    if reuse is None:
        write_model(os.path.join(out, "model"), m, w32)
    else:  # same seed as the reused case: the files on disk hold exactly these weights
        assert all(torch.equal(w32[k], GENERATED[reuse]["w32"][k]) for k in w32)
    GENERATED[case["name"]] = {"w32": w32}
    P = base_params(case, w32)
    if "quant" in case:
        report_quantization(w32, P, m["st_dtype"])

    data = make_data(m["vocab_size"], torch.Generator().manual_seed(case["seed"] + 7))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "data.jsonl"), "w") as f:
        for s in data:
            f.write(json.dumps({"input_ids": s}) + "\n")
    assert all(MIN_LEN <= len(s) <= min(MAX_LEN, SEQ_LEN) for s in data)

    ctx = {"model": m, "full": ad["type"] == "full", "lora_scale": 0.0, "bf16": case.get("compute") == "bf16"}
    if ad["type"] == "lora":
        init = make_init_adapter(m, ad, gen)
        GENERATED[case["name"]]["init"] = init
        if reuse is None:
            write_json(os.path.join(out, "init_adapter", "adapter_config.json"), adapter_config(ad))
            write_safetensors(os.path.join(out, "init_adapter", "adapter_model.safetensors"), init, "F32")
        else:
            assert adapter_config(ad) == adapter_config(REUSED_ADAPTERS[reuse])
            assert all(torch.equal(init[k], GENERATED[reuse]["init"][k]) for k in init)
        ctx["lora_scale"] = ad["alpha"] / (math.sqrt(ad["r"]) if ad["rslora"] else ad["r"])
        trainable = {k: v.to(F64).requires_grad_(True) for k, v in init.items()}
        P.update(trainable)
    else:
        trainable = {k: v.requires_grad_(True) for k, v in P.items()}
    write_text(os.path.join(out, "job.yaml"), job_yaml(case))

    if m["rope_scaling"] is not None and m["rope_scaling"]["rope_type"] == "llama3":
        regimes = check_llama3_regimes(m)
        print(f"  llama3 inv_freq: {regimes[0]} unchanged, {regimes[1]} smoothed, {regimes[2]} divided")
    if m.get("rope_local_base_freq") is not None:
        check_local_global(m)
        kinds = ["sliding" if is_sliding(m, i) else "full" for i in range(m["num_hidden_layers"])]
        print(f"  layers {kinds}; full layers RoPE theta {m['rope_theta']:g} / {m['rope_scaling']['factor']},"
              f" sliding layers theta {m['rope_local_base_freq']:g}")
    if m.get("fused"):
        print(f"  fused qkv_proj / gate_up_proj; rotary dims {rotary_dim(m)} of {head_dim(m)};"
              f" window {m['sliding_window']} on every layer of {SEQ_LEN}")
    if m.get("final_logit_softcapping") is not None:
        print(f"  soft-capping: attention {m['attn_logit_softcapping']}, logits {m['final_logit_softcapping']};"
              f" window {m['sliding_window']} of {SEQ_LEN}")
    check_padding_invariance(P, ctx, data)

    with torch.no_grad():
        logits0 = forward(P, ctx, torch.tensor([data[0]]))[0]
    write_safetensors(os.path.join(out, "expected", "logits_seq0.safetensors"),
                      {"logits": logits0}, "F32")

    if PROBE:
        # Unclipped run, only to help choose max_grad_norm; writes no expected/ files.
        metrics, _ = train(P, ctx, trainable, data, case["steps"], case["lr"], float("inf"))
        print(f"  unclipped grad_norm {metrics['grad_norm']}")
        print(f"  unclipped loss      {metrics['loss']}")
        return
    metrics, grads0 = train(P, ctx, trainable, data, case["steps"], case["lr"], case["max_grad_norm"])
    assert all(torch.count_nonzero(g) > 0 for g in grads0.values())

    # Clipping must act on some steps but not all.
    clipped = [case["max_grad_norm"] / (n + 1e-6) < 1.0 for n in metrics["grad_norm"]]
    assert any(clipped) and not all(clipped), (case["name"], metrics["grad_norm"])

    metrics["max_grad_norm"] = case["max_grad_norm"]
    write_json(os.path.join(out, "expected", "metrics.json"), metrics)
    write_safetensors(os.path.join(out, "expected", "grads_step1.safetensors"), f32(grads0), "F32")
    write_safetensors(os.path.join(out, "expected", "final.safetensors"), f32(trainable), "F32")
    if ad["type"] == "lora" and not ctx["bf16"]:
        ids, logits = greedy(P, ctx, data[0][:GREEDY_PROMPT])
        write_json(os.path.join(out, "expected", "greedy.json"), ids)
        write_safetensors(os.path.join(out, "expected", "greedy_logits.safetensors"), {"logits": logits}, "F32")
    if "quant" in case:  # the dequantized base linears the reference computed with
        write_safetensors(os.path.join(out, "expected", "nf4_base.safetensors"),
                          f32({k: v for k, v in P.items() if is_base_linear(k)}), "F32")

    # Finite-difference check of the step-0 gradients on the initial parameters (not through
    # bf16 rounding: piecewise constant, its gradient is the convention BF16 STORAGE states).
    if ctx["bf16"]:
        return print_metrics(case, metrics, clipped)
    P0 = base_params(case, w32)
    t0 = {k: v.to(F64) for k, v in init.items()} if ad["type"] == "lora" else P0
    P0.update(t0)
    check_finite_difference(P0, ctx, t0, grads0, data)
    print_metrics(case, metrics, clipped)


GREEDY_PROMPT, GREEDY_NEW = 5, 12


def greedy(P, ctx, prompt):
    """Greedy decoding with the trained adapter: GREEDY_NEW ids after `prompt`, each the argmax
    of a full forward over the ids so far (no cache), with the smallest top-1/top-2 logit gap met
    (asserted wide enough that float32 arithmetic picks the same ids); and the logits each id was
    picked from [GREEDY_NEW, V]."""
    ids, gaps, rows = list(prompt), [], []
    with torch.no_grad():
        for _ in range(GREEDY_NEW):
            last = forward(P, ctx, torch.tensor([ids]))[0, -1]
            top = torch.topk(last, 2).values
            gaps.append(float(top[0] - top[1]))
            rows.append(last)
            ids.append(int(last.argmax()))
    assert min(gaps) > 1e-4, gaps
    return {"prompt": list(prompt), "ids": ids[len(prompt):], "min_gap": min(gaps)}, torch.stack(rows)


def print_metrics(case, metrics, clipped):
    print(f"  loss      {[round(x, 6) for x in metrics['loss']]}")
    print(f"  grad_norm {[round(x, 6) for x in metrics['grad_norm']]}  (max {case['max_grad_norm']},"
          f" clipped {clipped})")
    print(f"  lr        {metrics['lr']}")
    print(f"  tokens    {metrics['tokens']}")


def report_quantization(w32, P, st_dtype):
    """Prints the NF4 round-trip error of the base linears (and checks it is sane)."""
    stored = round_to_storage(w32, st_dtype)
    err2 = ref2 = 0.0
    count = 0
    for k in w32:
        if is_base_linear(k):
            w = w32[k].to(F64)
            err2 += float(((P[k] - w) ** 2).sum())
            ref2 += float((w ** 2).sum())
            count += 1
        else:
            assert torch.equal(P[k], stored[k])   # everything else as stored
    rel = math.sqrt(err2 / ref2)
    assert count > 0 and 0.05 < rel < 0.12, rel
    print(f"  NF4 base linears: {count} tensors, relative RMS round-trip error {rel:.4f}")


PROBE = False
GENERATED = {}  # case name -> {"w32", "init"}: what a case with `reuse` must equal
REUSED_ADAPTERS = {c["name"]: c["adapter"] for c in CASES}


def main():
    global PROBE
    PROBE = "--probe" in sys.argv[1:]
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    for case in CASES:
        if names and case["name"] not in names:
            continue
        print(case["name"])
        run_case(case)


if __name__ == "__main__":
    main()
