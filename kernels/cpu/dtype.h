// The storage types of typed tensors and their conversions (kernels/cpu).
//
// A value is computed in float (double in the gradient checks) and may be
// kept between ops in a narrower storage type: bf16 (float's top half) or
// IEEE binary16. Loading a stored value is exact; storing rounds to nearest,
// ties to even (bf16: NaN kept quiet; half: beyond 65504 to infinity, below
// 2^-24 to zero, subnormals kept). So an op that stores bf16 gives bit for bit
// what the same op in float followed by RoundToBf16 gives.
//   float: 1 sign, 8 exponent (bias 127), 23 mantissa bits
//   bf16:  1 sign, 8 exponent (bias 127),  7 mantissa bits (float's top half)
//   half:  1 sign, 5 exponent (bias 15),  10 mantissa bits
#pragma once

#include <cstdint>
#include <cstring>

namespace ft::cpu {

namespace internal {
constexpr uint32_t kFloatAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInf = 0x7F800000u;

// std::bit_cast (this header is also compiled as C++17, by nvcc).
template <typename To, typename From>
inline To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From));
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

// Shifts `mant` right by `shift` (1..31) bits, rounding to nearest, ties to even.
inline uint32_t ShiftRightRne(uint32_t mant, int shift) {
  const uint32_t kept = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}
}  // namespace internal

inline uint16_t FloatToBf16(float f) {
  const uint32_t bits = internal::BitCast<uint32_t>(f);
  if ((bits & internal::kFloatAbsMask) > internal::kFloatInf) {
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

inline float Bf16ToFloat(uint16_t b) { return internal::BitCast<float>(static_cast<uint32_t>(b) << 16); }

inline uint16_t FloatToHalf(float f) {
  const uint32_t bits = internal::BitCast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & internal::kFloatAbsMask;
  if (abs > internal::kFloatInf)
    return sign | 0x7E00 | static_cast<uint16_t>((abs >> 13) & 0x3FF);  // quiet NaN
  // 65520 = 0x477FF000 is halfway between 65504 (max half, odd mantissa) and
  // 65536: ties go to even, i.e. up to infinity.
  if (abs >= 0x477FF000u) return sign | 0x7C00;
  if (abs >= 0x38800000u) {
    // Normal half (|f| >= 2^-14): rebias the exponent (127 -> 15, i.e.
    // subtract 112 << 23) and round 23 mantissa bits to 10; a mantissa carry
    // moves into the exponent field correctly.
    return sign | static_cast<uint16_t>(internal::ShiftRightRne(abs - (112u << 23), 13));
  }
  // Subnormal half: value = m * 2^-24. With the implicit bit, |f| =
  // mant * 2^(e - 150), so m = mant * 2^(e - 126) = mant >> (126 - e).
  const int e = static_cast<int>(abs >> 23);
  const int shift = 126 - e;    // >= 14 here
  if (shift > 24) return sign;  // |f| <= 2^-25 (at most the tie): rounds to 0
  const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
  return sign |
         static_cast<uint16_t>(internal::ShiftRightRne(mant, shift));  // may round up to 2^-14: still right
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0x1F)
    return internal::BitCast<float>(sign | internal::kFloatInf | (mant << 13));  // inf, NaN (payload kept)
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mant) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return internal::BitCast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

// The 16-bit storage types, distinct so templates can tell them apart.
struct Bf16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};

// The value of a stored element (exact).
inline float Load(float x) { return x; }
inline double Load(double x) { return x; }
inline float Load(Bf16 x) { return Bf16ToFloat(x.bits); }
inline float Load(Half x) { return HalfToFloat(x.bits); }
// *p = v in p's storage type (rounded to nearest even for the 16-bit ones).
inline void Store(float v, float* p) { *p = v; }
inline void Store(double v, double* p) { *p = v; }
inline void Store(float v, Bf16* p) { p->bits = FloatToBf16(v); }
inline void Store(float v, Half* p) { p->bits = FloatToHalf(v); }

}  // namespace ft::cpu
