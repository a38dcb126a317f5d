// NF4 blockwise quantization, bit-exact with bitsandbytes (see nf4.h).
//
// Floating point here must be evaluated exactly as written: no FMA
// contraction (the project builds with -std=c++20, i.e. GCC's
// -ffp-contract=off) and no reassociation. The two places that need an FMA
// call std::fma explicitly.
#include "kernels/cpu/nf4.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "common/openmp_start.h"
#include "common/status.h"

namespace ft::cpu {
namespace {

// bitsandbytes' nf4_dequantization_lut (csrc/kernels.cu), codes 0b0000..0b1111.
constexpr std::array<float, 16> kNf4Table = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

// The 15 float thresholds of bitsandbytes' dQuantizeNF4 decision tree, in
// ascending order: kNf4Thresholds[k] separates code k from code k + 1 (they
// are the midpoints of neighbouring table values, as the kernel spells them).
// As `f` literals each decimal is rounded once to float, as in the kernel;
// four of them would come out one ulp off through double (tests check this).
constexpr std::array<float, 15> kNf4Thresholds = {
    -0.8480964004993439f,  -0.6106329262256622f,  -0.4599952697753906f,   -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f,   0.2035212516784668f,   0.2920137718319893f,    0.3893125355243683f,
    0.5016634166240692f,   0.6427869200706482f,   0.8614784181118011f,
};

// Below this many blocks a thread team costs more than it saves.
[[maybe_unused]] constexpr int64_t kParallelMinBlocks = 256;

// torch.linspace(start, end, steps) for float32, as torch 1.13's CPU kernel
// (RangeFactoriesKernel.cpp, AVX2 build, compiled with FMA contraction) fills
// it: step = (end - start) / (steps - 1); index i < steps/2 gets
// start + step * i, the others end - step * (steps - 1 - i), each one FMA.
// The vectorised part (whole pairs of 8-lane vectors from the front) computes
// only each vector's first lane that way; lane j is then base + j * step,
// product and sum rounded separately. The tail is scalar. Verified against
// torch's values (tests/golden/nf4 stores torch's map).
std::vector<float> TorchLinspaceF32(float start, float end, int64_t steps) {
  std::vector<float> out(steps);
  if (steps == 1) {
    out[0] = start;
    return out;
  }
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  auto at = [&](int64_t i) {
    return i < halfway ? std::fma(step, static_cast<float>(i), start)
                       : std::fma(-step, static_cast<float>(steps - 1 - i), end);
  };
  constexpr int64_t kLanes = 8;
  const int64_t vector_end = steps / (2 * kLanes) * (2 * kLanes);
  for (int64_t v = 0; v < vector_end; v += kLanes) {
    const float base = at(v);
    out[v] = base;
    for (int64_t j = 1; j < kLanes; ++j) {
      const float offset = static_cast<float>(j) * step;  // rounded on its own
      out[v + j] = base + offset;
    }
  }
  for (int64_t i = vector_end; i < steps; ++i) out[i] = at(i);
  return out;
}

// create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for
// exponent i = 0..6, the 2^i means of neighbouring points of
// linspace(0.1, 1, 2^i + 1), times +-10^(i-6) (the Python scalar is rounded
// to float, then a float multiply); plus 0 and 1; sorted.
std::array<float, 256> ComputeSignedDynamicMap() {
  constexpr int kExponentBits = 7;
  constexpr double kPowersOfTen[kExponentBits] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<float> data;
  for (int i = 0; i < kExponentBits; ++i) {
    const int64_t items = (int64_t{1} << i) + 1;
    const std::vector<float> bounds = TorchLinspaceF32(static_cast<float>(0.1), 1.0f, items);
    const float scale = static_cast<float>(kPowersOfTen[i]);
    std::vector<float> means(items - 1);
    for (int64_t k = 0; k + 1 < items; ++k) means[k] = (bounds[k] + bounds[k + 1]) / 2.0f;
    for (float m : means) data.push_back(m * scale);
    for (float m : means) data.push_back(m * -scale);
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  FT_CHECK(data.size() == 256);
  std::sort(data.begin(), data.end());
  std::array<float, 256> map{};
  std::copy(data.begin(), data.end(), map.begin());
  return map;
}

// bitsandbytes' reciprocal of a block's absmax, except 0 for absmax 0 (see nf4.h).
float SafeReciprocal(float absmax) { return absmax > 0.0f ? 1.0f / absmax : 0.0f; }

}  // namespace

const float* Nf4Table() { return kNf4Table.data(); }

const float* SignedDynamicMap() {
  static const std::array<float, 256> map = ComputeSignedDynamicMap();
  return map.data();
}

// The kernel's tree, compactly: four comparisons descend a balanced tree over
// the sorted thresholds (first 0.0398 = [7], then [3] or [11], ...), taking the
// upper half when x > threshold. NaN compares false everywhere: code 0, as in
// the kernel.
uint8_t Nf4Code(float x) {
  int code = 0;
  for (int half = 8; half > 0; half >>= 1) {
    if (x > kNf4Thresholds[code + half - 1]) code += half;
  }
  return static_cast<uint8_t>(code);
}

// bitsandbytes' dQuantize<STOCHASTIC=0>: a 7-step binary search from index
// 127, remembering the nearest map values seen below (lo) and above (hi) the
// search; then a choice between the final index and its neighbour on the side
// of x, by comparing x with their float midpoint (value + neighbour) * 0.5f.
// Ties (x exactly at a midpoint) go to the final index. The bounds start as
// -1 / 1 and become map[0] / map[255] when the search never left that end.
uint8_t DynamicMapCode(const float* map, float x) {
  int index = 127;
  int lo_index = 0, hi_index = 255;
  float lo = -1.0f, hi = 1.0f;
  float value = map[index];
  for (int stride = 64; stride > 0; stride >>= 1) {
    if (x > value) {
      lo_index = index;
      lo = value;
      index += stride;
    } else {
      hi_index = index;
      hi = value;
      index -= stride;
    }
    value = map[index];
  }
  if (hi_index == 255) hi = map[255];
  if (lo_index == 0) lo = map[0];
  if (x > value) {
    const float midpoint = (hi + value) * 0.5f;
    return static_cast<uint8_t>(x > midpoint ? hi_index : index);
  }
  const float midpoint = (lo + value) * 0.5f;
  return static_cast<uint8_t>(x < midpoint ? lo_index : index);
}

int64_t Nf4Tensor::StorageBytes() const {
  int64_t bytes = static_cast<int64_t>(packed.size());
  bytes += static_cast<int64_t>(absmax.size() * sizeof(float));
  bytes += static_cast<int64_t>(absmax_q.size());
  bytes += static_cast<int64_t>(absmax2.size() * sizeof(float));
  if (config.double_quant) bytes += sizeof(float);  // offset
  return bytes;
}

double Nf4Tensor::BitsPerParam() const {
  return n > 0 ? static_cast<double>(StorageBytes()) * 8.0 / static_cast<double>(n) : 0.0;
}

Nf4Tensor QuantizeNf4(const float* x, int64_t n, const Nf4Config& config) {
  FT_CHECK(n >= 0);
  FT_CHECK(config.block > 0 && config.block % 2 == 0);
  FT_CHECK(!config.double_quant || config.dq_block > 0);
  Nf4Tensor q;
  q.n = n;
  q.config = config;
  const int64_t block = config.block;
  const int64_t blocks = q.num_blocks();
  q.packed.assign((n + 1) / 2, 0);
  std::vector<float> absmax(blocks);

  // First level: absmax per block, then the codes of x * (1 / absmax).
#pragma omp parallel for schedule(static) if (blocks >= kParallelMinBlocks)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * block;
    const int64_t end = std::min(n, begin + block);
    float amax = 0.0f;
    for (int64_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
    absmax[b] = amax;
    const float inv = SafeReciprocal(amax);
    // begin is even (block is), so pairs never straddle blocks.
    for (int64_t i = begin; i < end; i += 2) {
      const uint8_t high = Nf4Code(x[i] * inv);
      const uint8_t low = Nf4Code(i + 1 < end ? x[i + 1] * inv : 0.0f);  // odd n: pad like the kernel
      q.packed[i / 2] = static_cast<uint8_t>(high << 4 | low);
    }
  }

  if (!config.double_quant) {
    q.absmax = std::move(absmax);
    return q;
  }

  // Second level: subtract the mean, then 8-bit blockwise quantization of the
  // centred absmax values against the signed dynamic map.
  double sum = 0.0;
  for (int64_t b = 0; b < blocks; ++b) sum += absmax[b];
  q.offset = blocks > 0 ? static_cast<float>(sum / static_cast<double>(blocks)) : 0.0f;
  std::vector<float> centred(blocks);
  for (int64_t b = 0; b < blocks; ++b) centred[b] = absmax[b] - q.offset;

  const float* map = SignedDynamicMap();
  const int64_t dq_block = config.dq_block;
  const int64_t dq_blocks = (blocks + dq_block - 1) / dq_block;
  q.absmax_q.assign(blocks, 0);
  q.absmax2.assign(dq_blocks, 0.0f);
  for (int64_t j = 0; j < dq_blocks; ++j) {
    const int64_t begin = j * dq_block;
    const int64_t end = std::min(blocks, begin + dq_block);
    float amax = 0.0f;
    for (int64_t b = begin; b < end; ++b) amax = std::max(amax, std::fabs(centred[b]));
    q.absmax2[j] = amax;
    const float inv = SafeReciprocal(amax);
    for (int64_t b = begin; b < end; ++b) q.absmax_q[b] = DynamicMapCode(map, centred[b] * inv);
  }
  return q;
}

namespace {

// NF4 storage wherever it lies: a tensor's vectors or a blob.
struct Nf4View {
  int64_t n = 0;
  Nf4Config config;
  float offset = 0;
  const uint8_t* packed = nullptr;
  const float* absmax = nullptr;
  const uint8_t* absmax_q = nullptr;
  const float* absmax2 = nullptr;
  int64_t num_blocks() const { return (n + config.block - 1) / config.block; }
};

Nf4View ViewOf(const Nf4Tensor& q) {
  const int64_t blocks = q.num_blocks();
  FT_CHECK(static_cast<int64_t>(q.packed.size()) == (q.n + 1) / 2);
  if (!q.config.double_quant) {
    FT_CHECK(static_cast<int64_t>(q.absmax.size()) == blocks);
  } else {
    FT_CHECK(static_cast<int64_t>(q.absmax_q.size()) == blocks);
    FT_CHECK(static_cast<int64_t>(q.absmax2.size()) == (blocks + q.config.dq_block - 1) / q.config.dq_block);
  }
  return {q.n, q.config, q.offset, q.packed.data(), q.absmax.data(), q.absmax_q.data(), q.absmax2.data()};
}

Nf4View ViewOf(const Nf4Layout& l, const uint8_t* blob) {
  Nf4View v{l.n, l.config, l.offset, blob, nullptr, nullptr, nullptr};
  if (l.config.double_quant) {
    v.absmax_q = blob + l.absmax_at;
    v.absmax2 = reinterpret_cast<const float*>(blob + l.absmax2_at);
  } else {
    v.absmax = reinterpret_cast<const float*>(blob + l.absmax_at);
  }
  return v;
}

void BlockScales(const Nf4View& q, float* scale) {
  const int64_t blocks = q.num_blocks();
  if (!q.config.double_quant) {
    std::copy(q.absmax, q.absmax + blocks, scale);
    return;
  }
  const float* map = SignedDynamicMap();
  for (int64_t b = 0; b < blocks; ++b) {
    // dequantize_blockwise writes map * absmax2 to a float tensor, then
    // `absmax += offset`: two separately rounded operations.
    const float unshifted = map[q.absmax_q[b]] * q.absmax2[b / q.config.dq_block];
    scale[b] = unshifted + q.offset;
  }
}

void Dequantize(const Nf4View& q, float* out) {
  const int64_t n = q.n;
  const int64_t block = q.config.block;
  const int64_t blocks = q.num_blocks();
  std::vector<float> scale(blocks);
  BlockScales(q, scale.data());
#pragma omp parallel for schedule(static) if (blocks >= kParallelMinBlocks)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * block;
    const int64_t end = std::min(n, begin + block);
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t byte = q.packed[i / 2];
      const uint8_t code = (i % 2 == 0) ? byte >> 4 : byte & 0x0F;
      out[i] = kNf4Table[code] * scale[b];
    }
  }
}

int64_t Align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

}  // namespace

void Nf4BlockScales(const Nf4Tensor& q, float* scale) { BlockScales(ViewOf(q), scale); }

void DequantizeNf4(const Nf4Tensor& q, float* out) { Dequantize(ViewOf(q), out); }

Nf4Layout Nf4BlobLayoutFor(int64_t n, const Nf4Config& config) {
  Nf4Layout l;
  l.n = n;
  l.config = config;
  const int64_t blocks = l.num_blocks();
  l.absmax_at = Align16((n + 1) / 2);
  const int64_t scales = config.double_quant ? blocks : blocks * static_cast<int64_t>(sizeof(float));
  l.absmax2_at = Align16(l.absmax_at + scales);
  l.absmax2_n = config.double_quant ? (blocks + config.dq_block - 1) / config.dq_block : 0;
  l.bytes = l.absmax2_at + l.absmax2_n * static_cast<int64_t>(sizeof(float));
  return l;
}

Nf4Layout Nf4BlobLayout(const Nf4Tensor& q) {
  Nf4Layout l;
  l.n = q.n;
  l.config = q.config;
  l.offset = q.offset;
  l.absmax_at = Align16(static_cast<int64_t>(q.packed.size()));
  const int64_t scales = q.config.double_quant ? static_cast<int64_t>(q.absmax_q.size())
                                               : static_cast<int64_t>(q.absmax.size() * sizeof(float));
  l.absmax2_at = Align16(l.absmax_at + scales);
  l.absmax2_n = static_cast<int64_t>(q.absmax2.size());
  l.bytes = l.absmax2_at + l.absmax2_n * static_cast<int64_t>(sizeof(float));
  return l;
}

void PackNf4Blob(const Nf4Tensor& q, const Nf4Layout& l, uint8_t* blob) {
  const Nf4View v = ViewOf(q);  // checks the sizes
  std::fill(blob, blob + l.bytes, uint8_t{0});
  std::copy(q.packed.begin(), q.packed.end(), blob);
  if (q.config.double_quant) {
    std::copy(v.absmax_q, v.absmax_q + q.absmax_q.size(), blob + l.absmax_at);
    std::memcpy(blob + l.absmax2_at, v.absmax2, q.absmax2.size() * sizeof(float));
  } else {
    std::memcpy(blob + l.absmax_at, v.absmax, q.absmax.size() * sizeof(float));
  }
}

void DequantizeNf4Blob(const Nf4Layout& layout, const uint8_t* blob, float* out) {
  Dequantize(ViewOf(layout, blob), out);
}

}  // namespace ft::cpu
