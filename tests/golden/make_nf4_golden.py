#!/usr/bin/python3
"""Golden reference values for ftune's NF4 quantization (QLoRA base weights).

What it makes
-------------
tests/golden/nf4/nf4_cases.safetensors with, for every case below,

    <case>.config     I64 [4]   n, block, double_quant (0/1), dq_block
    <case>.input      F32 [n]   the values quantized
    <case>.packed     U8  [(n+1)/2]  NF4 codes, element 2i in the HIGH nibble
    <case>.absmax     F32 [blocks]    (cases without double quantization)
    <case>.absmax_q   U8  [blocks]    (cases with double quantization)
    <case>.absmax2    F32 [dq_blocks] (cases with double quantization)
    <case>.offset     F32 [1]         (cases with double quantization)
    <case>.scale      F32 [blocks]    the block scales dequantization multiplies by
    <case>.dequant    F32 [n]         the dequantized values

plus `dynamic_map` (F32 [256], bitsandbytes' create_dynamic_map(signed=True)
as torch computes it), `nf4_table` (F32 [16]) and `nf4_thresholds` (F32 [15],
the decision tree's float constants, ascending: code k ends at threshold k).

The algorithm is bitsandbytes' (csrc kernels kQuantizeBlockwise /
kDequantizeBlockwise for NF4, functional.quantize_4bit(compress_statistics=True)
for the double quantization); the bitsandbytes package is not needed. It is
written here independently of the C++ (kernels/cpu/nf4.cc), vectorised with
numpy:

  * NF4 code of a normalised value = the number of the 15 kernel thresholds it
    is strictly greater than (the kernel's decision tree is a search over the
    same sorted thresholds with `x > t`).
  * the 8-bit code of the statistics runs bitsandbytes' dQuantize<0> binary
    search on whole arrays at once.
  * the double-quant offset is the mean of the block absmax values with a
    defined order: accumulate in double in index order, divide in double,
    round to float32. (bitsandbytes takes torch's float32 `absmax.mean()`,
    whose summation order is implementation-defined; we assert below that
    torch's `absmax.double().mean().float()` agrees on every case.)

Deliberate deviation, only for blocks whose absmax is 0 (all-zero blocks, or a
second-level block whose centred absmax values are all 0): the reciprocal is 0
instead of 1/0 = inf, so every value normalises to 0 and gets code(0) (NF4 code
7 = 0.0, dynamic-map index 127 = 0.0) and such blocks dequantize to exactly 0.
bitsandbytes would compute 0 * inf = NaN, which its trees send to code 0.

How to rerun
------------
    /usr/bin/python3 tests/golden/make_nf4_golden.py

Needs torch (Debian's 1.13) and numpy. Everything is seeded; a rerun rewrites
the same file byte for byte. make_golden.py imports nf4_roundtrip() from here
for its llama_qlora case.
"""

import json
import os
import struct
from fractions import Fraction

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = np.float32

# ----------------------------------------------------------------------------
# Constants from bitsandbytes
# ----------------------------------------------------------------------------

# functional.get_4bit_type("nf4") / csrc nf4_dequantization_lut, codes 0..15.
NF4_TABLE_TEXT = [
    "-1.0", "-0.6961928009986877", "-0.5250730514526367", "-0.39491748809814453",
    "-0.28444138169288635", "-0.18477343022823334", "-0.09105003625154495", "0.0",
    "0.07958029955625534", "0.16093020141124725", "0.24611230194568634", "0.33791524171829224",
    "0.44070982933044434", "0.5626170039176941", "0.7229568362236023", "1.0",
]

# The float literals of the dQuantizeNF4 decision tree (csrc/kernels.cu), sorted.
NF4_THRESHOLDS_TEXT = [
    "-0.8480964004993439", "-0.6106329262256622", "-0.4599952697753906", "-0.33967943489551544",
    "-0.23460740596055984", "-0.13791173323988914", "-0.045525018125772476", "0.03979014977812767",
    "0.1202552504837513", "0.2035212516784668", "0.2920137718319893", "0.3893125355243683",
    "0.5016634166240692", "0.6427869200706482", "0.8614784181118011",
]


def float32_literal(text):
    """A C `...f` literal: the decimal rounded once, directly, to float32
    (round to nearest, ties to even), as GCC and nvcc convert it.

    Going decimal -> double -> float32 (what numpy does) can differ: the
    kernel's thresholds are float32 midpoints computed in double, so some sit
    within a double rounding of a float32 tie (-0.8480964004993439 does).
    """
    exact = Fraction(text)
    guess = F32(float(text))
    cands = [np.nextafter(guess, F32(-np.inf)), guess, np.nextafter(guess, F32(np.inf))]
    dist = [abs(Fraction(float(c)) - exact) for c in cands]
    best = min(dist)
    winners = [c for c, d in zip(cands, dist) if d == best]
    if len(winners) > 1:  # exact tie: the even mantissa
        winners = [c for c in winners if int(np.array(c, dtype=F32).view(np.uint32)) % 2 == 0]
    return winners[0]


NF4_TABLE = np.array([float32_literal(t) for t in NF4_TABLE_TEXT], dtype=F32)
NF4_THRESHOLDS = np.array([float32_literal(t) for t in NF4_THRESHOLDS_TEXT], dtype=F32)
assert np.all(np.diff(NF4_TABLE) > 0) and np.all(np.diff(NF4_THRESHOLDS) > 0)
# each threshold lies between the two table values it separates, near their midpoint
for k in range(15):
    assert NF4_TABLE[k] < NF4_THRESHOLDS[k] < NF4_TABLE[k + 1]
    assert abs(float(NF4_THRESHOLDS[k]) - (float(NF4_TABLE[k]) + float(NF4_TABLE[k + 1])) / 2) < 1e-6


def create_dynamic_map_signed():
    """bitsandbytes.functional.create_dynamic_map(signed=True, max_exponent_bits=7,
    total_bits=8), spelled out with the same torch calls (float32 linspace,
    means, scaled by the Python scalars 10**(i-6))."""
    max_exponent_bits, total_bits = 7, 8
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    assert additional_items == 0  # the signed 8-bit map has no extra linear items
    data = []
    for i in range(max_exponent_bits):
        fraction_items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1)
        boundaries = torch.linspace(0.1, 1, fraction_items)          # float32
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    data.sort()
    return torch.tensor(data, dtype=torch.float32).numpy()


DYNAMIC_MAP = create_dynamic_map_signed()
assert DYNAMIC_MAP[127] == 0 and DYNAMIC_MAP[255] == 1 and np.all(np.diff(DYNAMIC_MAP) > 0)

# ----------------------------------------------------------------------------
# The quantizers
# ----------------------------------------------------------------------------


def reciprocal(absmax):
    """float32 1/absmax, except 0 where absmax == 0 (the all-zero-block rule)."""
    out = np.zeros_like(absmax, dtype=F32)
    nz = absmax > 0
    out[nz] = F32(1.0) / absmax[nz]
    return out


def blocks_of(x, block):
    """x (float32 [n]) zero-padded to whole blocks, as [blocks, block]."""
    n = x.shape[0]
    nb = (n + block - 1) // block
    padded = np.zeros(nb * block, dtype=x.dtype)
    padded[:n] = x
    return padded.reshape(nb, block)


def nf4_codes(xn):
    """NF4 code of normalised float32 values: count of thresholds t with x > t."""
    return (xn[..., None] > NF4_THRESHOLDS).sum(axis=-1).astype(np.uint8)


def dynamic_codes(code, x):
    """bitsandbytes dQuantize<0> on every element of float32 array x at once."""
    x = np.asarray(x, dtype=F32)
    pivot = np.full(x.shape, 127, dtype=np.int64)
    lower_pivot = np.zeros(x.shape, dtype=np.int64)
    upper_pivot = np.full(x.shape, 255, dtype=np.int64)
    lower = np.full(x.shape, -1.0, dtype=F32)
    upper = np.full(x.shape, 1.0, dtype=F32)
    val = code[pivot]
    for i in (64, 32, 16, 8, 4, 2, 1):
        right = x > val
        lower_pivot = np.where(right, pivot, lower_pivot)
        lower = np.where(right, val, lower)
        upper_pivot = np.where(right, upper_pivot, pivot)
        upper = np.where(right, upper, val)
        pivot = np.where(right, pivot + i, pivot - i)
        val = code[pivot]
    upper = np.where(upper_pivot == 255, code[255], upper).astype(F32)
    lower = np.where(lower_pivot == 0, code[0], lower).astype(F32)
    right = x > val
    mid_up = ((upper + val) * F32(0.5)).astype(F32)
    mid_lo = ((lower + val) * F32(0.5)).astype(F32)
    out = np.where(right, np.where(x > mid_up, upper_pivot, pivot),
                   np.where(x < mid_lo, lower_pivot, pivot))
    return out.astype(np.uint8)


def mean_double_in_order(v):
    """Sum in double in index order, divide in double, round to float32."""
    s = 0.0
    for a in v.tolist():
        s += a
    m = F32(s / len(v)) if len(v) else F32(0)
    # torch's double mean (pairwise order) rounds to the same float32 here
    if len(v):
        assert F32(torch.from_numpy(v).double().mean().float().item()) == m
    return m


def quantize_nf4(x, block=64, double_quant=True, dq_block=256):
    """x: float32 numpy [n]. Returns a dict with the bitsandbytes state."""
    x = np.ascontiguousarray(x, dtype=F32)
    n = x.shape[0]
    xb = blocks_of(x, block)                              # padding is 0
    absmax = np.abs(xb).max(axis=1).astype(F32)
    xn = (xb * reciprocal(absmax)[:, None]).astype(F32)   # float multiply by 1/absmax
    codes = nf4_codes(xn).reshape(-1)[:n + (n % 2)]       # odd n: pad code = code(0)
    packed = (codes[0::2] << 4) | codes[1::2]
    st = {"n": n, "block": block, "double_quant": double_quant, "dq_block": dq_block,
          "packed": packed.astype(np.uint8)}
    if not double_quant:
        st["absmax"] = absmax
        return st
    offset = mean_double_in_order(absmax)
    centred = (absmax - offset).astype(F32)
    cb = blocks_of(centred, dq_block)
    absmax2 = np.abs(cb).max(axis=1).astype(F32)
    cn = (cb * reciprocal(absmax2)[:, None]).astype(F32)
    st["absmax_q"] = dynamic_codes(DYNAMIC_MAP, cn).reshape(-1)[:absmax.shape[0]]
    st["absmax2"] = absmax2
    st["offset"] = offset
    return st


def block_scales(st):
    if not st["double_quant"]:
        return st["absmax"]
    a2 = np.repeat(st["absmax2"], st["dq_block"])[:st["absmax_q"].shape[0]]
    unshifted = (DYNAMIC_MAP[st["absmax_q"]] * a2).astype(F32)   # dequantize_blockwise
    return (unshifted + st["offset"]).astype(F32)                 # absmax += offset


def dequantize_nf4(st):
    n = st["n"]
    codes = np.stack([st["packed"] >> 4, st["packed"] & 0x0F], axis=1).reshape(-1)[:n]
    scale = np.repeat(block_scales(st), st["block"])[:n]
    return (NF4_TABLE[codes] * scale).astype(F32)


def nf4_roundtrip(x, block=64, double_quant=True, dq_block=256):
    """float32 values -> NF4 -> float32 (the weights a QLoRA base model computes with)."""
    return dequantize_nf4(quantize_nf4(x, block, double_quant, dq_block))


# ----------------------------------------------------------------------------
# Self-checks of the reference
# ----------------------------------------------------------------------------


def check_reference():
    # NF4 code = nearest table value, except at exact midpoints (none in random data)
    xs = np.linspace(-1, 1, 20001, dtype=F32)
    near = np.abs(xs[:, None] - NF4_TABLE[None, :]).argmin(axis=1)
    assert np.array_equal(nf4_codes(xs), near.astype(np.uint8))
    assert nf4_codes(np.array([0.0], dtype=F32))[0] == 7
    assert np.array_equal(nf4_codes(NF4_TABLE), np.arange(16, dtype=np.uint8))
    # dQuantize<0> = nearest map value for random values in [-1, 1]
    r = np.random.default_rng(5).uniform(-1, 1, 100000).astype(F32)
    near = np.abs(r[:, None].astype(np.float64) - DYNAMIC_MAP[None, :]).argmin(axis=1)
    got = dynamic_codes(DYNAMIC_MAP, r)
    assert np.mean(got == near) > 0.999, np.mean(got == near)
    assert np.array_equal(dynamic_codes(DYNAMIC_MAP, DYNAMIC_MAP), np.arange(256, dtype=np.uint8))


# ----------------------------------------------------------------------------
# safetensors writing (as make_golden.py, plus U8 and I64)
# ----------------------------------------------------------------------------

NP_DTYPES = {"F32": "<f4", "U8": "u1", "I64": "<i8"}


def write_safetensors(path, tensors):
    """tensors: {name: (st_dtype, numpy array)}; names sorted, data in that order."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        st_dtype, arr = tensors[name]
        b = np.ascontiguousarray(arr).astype(NP_DTYPES[st_dtype]).tobytes()
        header[name] = {"dtype": st_dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    header["__metadata__"] = {"format": "pt"}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


# ----------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------


def normal(n, std, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g, dtype=torch.float32) * std).numpy()


def zero_block_input():
    """8 blocks of 64: blocks 2 and 5 all zero, block 6 a single nonzero value,
    scattered exact zeros elsewhere."""
    x = normal(8 * 64, 0.02, 404)
    x[2 * 64:3 * 64] = 0
    x[5 * 64:6 * 64] = 0
    x[6 * 64:7 * 64] = 0
    x[6 * 64 + 17] = -0.03
    x[3::11] = 0
    return x


def large_magnitude_input():
    """Blocks spanning magnitudes 1e-3 .. 1e4, with outliers and values at the
    block absmax (codes 0 and 15) and at exact table multiples."""
    g = torch.Generator().manual_seed(505)
    nb = 120
    n = 64 * nb
    x = torch.randn(n, generator=g, dtype=torch.float32)
    mags = 10.0 ** (torch.rand(nb, generator=g, dtype=torch.float64) * 7 - 3)
    x = (x.view(nb, 64) * mags[:, None].float()).reshape(-1)
    out = torch.randint(0, n, (20,), generator=g)
    x[out] = x[out] * 50                                   # outliers
    x = x.numpy().copy()
    b = 7 * 64                                             # one block of table multiples
    x[b:b + 16] = NF4_TABLE * F32(3.5)
    x[b + 16:b + 32] = -NF4_TABLE * F32(3.5)
    x[b + 32:b + 64] = F32(0.25)
    return x


def cases():
    base = normal(4096, 0.02, 101)
    yield "normal_b64_dq", base, 64, True
    yield "normal_b64", base, 64, False
    yield "odd_n1001_dq", normal(1001, 0.02, 202), 64, True
    yield "odd_n1001", normal(1001, 0.02, 202), 64, False
    yield "zero_blocks_dq", zero_block_input(), 64, True
    yield "zero_blocks", zero_block_input(), 64, False
    # 40 full blocks of 128 + a partial one of 37 (odd)
    yield "block128_dq", normal(128 * 40 + 37, 0.05, 303), 128, True
    yield "block128", normal(128 * 40 + 37, 0.05, 303), 128, False
    # 520 blocks of 64: dq blocks of 256, 256 and a partial 8
    yield "many_blocks_dq", normal(64 * 520, 0.02, 606), 64, True
    yield "large_magnitude_dq", large_magnitude_input(), 64, True
    yield "large_magnitude", large_magnitude_input(), 64, False


def main():
    check_reference()
    tensors = {"dynamic_map": ("F32", DYNAMIC_MAP), "nf4_table": ("F32", NF4_TABLE),
               "nf4_thresholds": ("F32", NF4_THRESHOLDS)}
    for name, x, block, dq in cases():
        st = quantize_nf4(x, block, dq, 256)
        deq = dequantize_nf4(st)
        n = x.shape[0]
        tensors[name + ".config"] = ("I64", np.array([n, block, int(dq), 256], dtype=np.int64))
        tensors[name + ".input"] = ("F32", x)
        tensors[name + ".packed"] = ("U8", st["packed"])
        tensors[name + ".scale"] = ("F32", block_scales(st))
        tensors[name + ".dequant"] = ("F32", deq)
        if dq:
            tensors[name + ".absmax_q"] = ("U8", st["absmax_q"])
            tensors[name + ".absmax2"] = ("F32", st["absmax2"])
            tensors[name + ".offset"] = ("F32", np.array([st["offset"]], dtype=F32))
        else:
            tensors[name + ".absmax"] = ("F32", st["absmax"])
        nz = x != 0
        rel = np.sqrt(np.mean((deq - x).astype(np.float64) ** 2) / np.mean(x.astype(np.float64) ** 2))
        zero_blocks = int((np.abs(blocks_of(x, block)).max(axis=1) == 0).sum())
        print(f"{name:20s} n={n:6d} block={block:3d} dq={int(dq)} rel_rms={rel:.4f} "
              f"zero_blocks={zero_blocks} exact_zeros_kept={bool(np.all(deq[~nz] == 0))}")
    write_safetensors(os.path.join(HERE, "nf4", "nf4_cases.safetensors"), tensors)


if __name__ == "__main__":
    main()
