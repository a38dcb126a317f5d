// NF4 (4-bit NormalFloat) blockwise quantization of frozen base weights
// (QLoRA), bit-exact with bitsandbytes' CUDA kernels (kQuantizeBlockwise /
// kDequantizeBlockwise with DATA_TYPE NF4, and functional.quantize_4bit with
// compress_statistics=True for the double quantization of the block scales).
//
// Quantization of n values x[0..n) in blocks of `block` (the last block may be
// partial, with the remaining elements):
//   absmax[b] = max |x| over the block
//   code(x)   = NF4 decision tree of x * (1.0f / absmax[b])   (float reciprocal,
//               then a float multiply, as the kernel does; thresholds are the
//               kernel's float constants, `x > t` picks the upper side)
//   packed    = two codes per byte, element 2i in the HIGH nibble, 2i+1 in the
//               low one; an odd n pads the last low nibble with code(0) = 7
// Dequantization: Nf4Table()[code] * scale[b] (one float multiply), where
// scale[b] = absmax[b], or with double quantization the dequantized absmax:
//   offset      = mean(absmax), accumulated in double in index order, divided
//                 in double and rounded to float (torch's float32 mean has an
//                 implementation-defined order; this is the defined one, and the
//                 reference tests/golden/make_nf4_golden.py computes the same)
//   c[b]        = absmax[b] - offset (float)
//   absmax2[j]  = max |c| over dq-block j (dq_block consecutive scales)
//   absmax_q[b] = bitsandbytes' dQuantize<0>(SignedDynamicMap(), c[b] * (1.0f / absmax2[j]))
//   scale[b]    = SignedDynamicMap()[absmax_q[b]] * absmax2[j] + offset
//                 (float multiply, then float add: two roundings, never an FMA)
//
// The one deliberate deviation from bitsandbytes: a block (or dq-block) whose
// absmax is 0 uses the reciprocal 0 instead of 1/0 = inf. bitsandbytes would
// normalise 0 * inf = NaN, which its decision trees send to code 0 (NF4 -1.0,
// dynamic map -1.0); here every element becomes code(0): NF4 code 7 (0.0) and
// dynamic-map index 127 (0.0). All-zero blocks then dequantize to exactly 0,
// also under double quantization (where bitsandbytes would give -scale[b]).
// Everything else matches bitsandbytes bit for bit (tests/golden/nf4).
//
// Inputs must be finite (a NaN or inf in a block makes its codes meaningless,
// as in bitsandbytes). Results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

namespace ft::cpu {

struct Nf4Config {
  int64_t block = 64;        // values per NF4 block; positive and even
  bool double_quant = true;  // quantize the block absmax values to 8 bits (QLoRA)
  int64_t dq_block = 256;    // absmax values per second-level block (bitsandbytes: 256)
};

// n values quantized to NF4; storage exactly as bitsandbytes lays it out.
struct Nf4Tensor {
  int64_t n = 0;
  Nf4Config config;
  std::vector<uint8_t> packed;    // (n+1)/2 bytes; element 2i in the HIGH nibble, 2i+1 in the low one
  std::vector<float> absmax;      // one per block (only without double quant)
  std::vector<uint8_t> absmax_q;  // with double quant: 8-bit dynamic-map index per block
  std::vector<float> absmax2;     // with double quant: one fp32 per dq_block codes
  float offset = 0;               // with double quant: mean of the absmax values that was subtracted

  int64_t num_blocks() const { return (n + config.block - 1) / config.block; }
  // Bytes of all of the above (offset counted as 4 bytes when double quant is
  // on). The 256-entry dynamic map and the NF4 table are shared constants and
  // not counted.
  int64_t StorageBytes() const;
  double BitsPerParam() const;  // StorageBytes * 8 / n
};

// NF4 storage as one byte blob, the form the engine keeps NF4 weights in
// (backend memory, or host memory when offloaded), so the whole tensor moves
// with one copy: [packed | absmax or absmax_q | absmax2], each part starting
// 16-byte aligned. The layout is the metadata the blob needs beside it.
struct Nf4Layout {
  int64_t n = 0;
  Nf4Config config;
  float offset = 0;
  int64_t absmax_at = 0;   // byte offset of absmax (fp32, no double quant) or absmax_q (uint8)
  int64_t absmax2_at = 0;  // byte offset of absmax2 (fp32, double quant)
  int64_t absmax2_n = 0;   // absmax2 values
  int64_t bytes = 0;       // the blob's size
  int64_t num_blocks() const { return (n + config.block - 1) / config.block; }
};
Nf4Layout Nf4BlobLayout(const Nf4Tensor& q);
// The layout QuantizeNf4 gives any tensor of n values under `config` (its
// offset 0): the sizes alone, for what needs the blob's shape without its
// values (the CUDA cost model).
Nf4Layout Nf4BlobLayoutFor(int64_t n, const Nf4Config& config);
// Writes q into blob[layout.bytes] (layout = Nf4BlobLayout(q)); padding is zero.
void PackNf4Blob(const Nf4Tensor& q, const Nf4Layout& layout, uint8_t* blob);
// out[layout.n] = DequantizeNf4 of the tensor packed in `blob`, bit for bit.
void DequantizeNf4Blob(const Nf4Layout& layout, const uint8_t* blob, float* out);

Nf4Tensor QuantizeNf4(const float* x, int64_t n, const Nf4Config& config);
// out[q.n].
void DequantizeNf4(const Nf4Tensor& q, float* out);
// The per-block scales DequantizeNf4 multiplies by: absmax, or the
// dequantized absmax under double quant. scale[q.num_blocks()].
void Nf4BlockScales(const Nf4Tensor& q, float* scale);

// The 16 NF4 values, ascending (bitsandbytes' nf4_dequantization_lut).
const float* Nf4Table();
// bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7,
// total_bits=8): 256 values, ascending, [127] = 0, [255] = 1. Computed the way
// torch (1.13, CPU, AVX2 kernels) evaluates that Python function in float32,
// linspace rounding included, so it equals torch's tensor bit for bit.
const float* SignedDynamicMap();

// The two scalar coders, for the CUDA port's tests. `x` is already normalised.
uint8_t Nf4Code(float x);                           // dQuantizeNF4 decision tree
uint8_t DynamicMapCode(const float* map, float x);  // dQuantize<0> binary search over a 256-entry map

}  // namespace ft::cpu
