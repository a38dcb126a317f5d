// bf16 and IEEE binary16 conversions, all round-to-nearest-even.
//   float: 1 sign, 8 exponent (bias 127), 23 mantissa bits
//   bf16:  1 sign, 8 exponent (bias 127),  7 mantissa bits (float's top half)
//   half:  1 sign, 5 exponent (bias 15),  10 mantissa bits
#include <bit>

#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

constexpr uint32_t kFloatAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInf = 0x7F800000u;

// Shifts `mant` right by `shift` (1..31) bits, rounding to nearest, ties to even.
uint32_t ShiftRightRne(uint32_t mant, int shift) {
  const uint32_t kept = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

}  // namespace

uint16_t FloatToBf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & kFloatAbsMask) > kFloatInf) {
    // NaN: keep sign and top payload bits, set the quiet bit so the payload
    // cannot truncate to the infinity pattern.
    return static_cast<uint16_t>((bits >> 16) | 0x0040);
  }
  // Adding 0x7FFF (+1 when the kept lsb is odd) carries into bit 16 exactly
  // when the dropped half is above the tie, or at the tie with an odd lsb. A
  // carry out of the mantissa bumps the exponent, up to infinity: all correct.
  const uint32_t bias = 0x7FFFu + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + bias) >> 16);
}

float Bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

void RoundToBf16(float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) x[i] = Bf16ToFloat(FloatToBf16(x[i]));
}

uint16_t FloatToHalf(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & kFloatAbsMask;
  if (abs > kFloatInf) return sign | 0x7E00 | static_cast<uint16_t>((abs >> 13) & 0x3FF);  // quiet NaN
  // 65520 = 0x477FF000 is halfway between 65504 (max half, odd mantissa) and
  // 65536: ties go to even, i.e. up to infinity.
  if (abs >= 0x477FF000u) return sign | 0x7C00;
  if (abs >= 0x38800000u) {
    // Normal half (|f| >= 2^-14): rebias the exponent (127 -> 15, i.e.
    // subtract 112 << 23) and round 23 mantissa bits to 10; a mantissa carry
    // moves into the exponent field correctly.
    return sign | static_cast<uint16_t>(ShiftRightRne(abs - (112u << 23), 13));
  }
  // Subnormal half: value = m * 2^-24. With the implicit bit, |f| =
  // mant * 2^(e - 150), so m = mant * 2^(e - 126) = mant >> (126 - e).
  const int e = static_cast<int>(abs >> 23);
  const int shift = 126 - e;    // >= 14 here
  if (shift > 24) return sign;  // |f| <= 2^-25 (at most the tie): rounds to 0
  const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
  return sign | static_cast<uint16_t>(ShiftRightRne(mant, shift));  // may round up to 2^-14: still right
}

void NarrowTo16(bool bf16, const float* x, int64_t n, uint16_t* out) {
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) out[i] = bf16 ? FloatToBf16(x[i]) : FloatToHalf(x[i]);
}

void WidenFrom16(bool bf16, const uint16_t* x, int64_t n, float* out) {
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) out[i] = bf16 ? Bf16ToFloat(x[i]) : HalfToFloat(x[i]);
}

void RoundToFp16(float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= (1 << 15))
  for (int64_t i = 0; i < n; ++i) x[i] = HalfToFloat(FloatToHalf(x[i]));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return std::bit_cast<float>(sign | kFloatInf | (mant << 13));  // inf, NaN (payload kept)
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mant) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

}  // namespace ft::cpu
