// bf16 and IEEE half conversions: known bit patterns, ties, specials, and
// exhaustive round trips; rounding checked against a nearest-value search.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

float FromBits(uint32_t bits) { return std::bit_cast<float>(bits); }

TEST(CpuDtype, Bf16KnownValues) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(3.14159f), 0x4049);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  EXPECT_EQ(Bf16ToFloat(0x4049), 3.140625f);
  EXPECT_EQ(Bf16ToFloat(0x3F80), 1.0f);
}

TEST(CpuDtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808000)), 0x3F80);               // tie, even below
  EXPECT_EQ(FloatToBf16(FromBits(0x3F818000)), 0x3F82);               // tie, even above
  EXPECT_EQ(FloatToBf16(FromBits(0x3F808001)), 0x3F81);               // just above the tie
  EXPECT_EQ(FloatToBf16(FromBits(0x3F807FFF)), 0x3F80);               // just below the tie
  EXPECT_EQ(FloatToBf16(FromBits(0xBF818000)), 0xBF82);               // sign does not matter
  EXPECT_EQ(FloatToBf16(FromBits(0x3FFF8000)), 0x4000);               // mantissa carry into the exponent
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7F80);  // past bf16 max: inf
  EXPECT_EQ(FloatToBf16(FromBits(0x00018000)), 0x0002);               // subnormals round the same way
}

TEST(CpuDtype, Bf16SpecialValues) {
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(FloatToBf16(FromBits(0xFFC00000)), 0xFFC0);
  // A signalling NaN whose payload lives in the dropped bits stays a (quiet) NaN.
  EXPECT_EQ(FloatToBf16(FromBits(0x7F800001)), 0x7FC0);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0x7FBFFFFF)))));
}

// The nearest bf16 to finite f: the truncated pattern or the next one away
// from zero, whichever is closer, ties to the even pattern.
uint16_t NearestBf16(float f) {
  const uint16_t lo = static_cast<uint16_t>(std::bit_cast<uint32_t>(f) >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double a = std::abs(double(f));
  const double lo_mag = std::abs(double(Bf16ToFloat(lo)));
  // Past the largest finite bf16 the next pattern is infinity: measure to 2^128.
  const double hi_mag = (hi & 0x7FFF) == 0x7F80 ? std::ldexp(1.0, 128) : std::abs(double(Bf16ToFloat(hi)));
  if (a - lo_mag != hi_mag - a) return a - lo_mag < hi_mag - a ? lo : hi;
  return (lo & 1) == 0 ? lo : hi;
}

TEST(CpuDtype, Bf16MatchesNearestValueSearch) {
  std::mt19937 rng(1);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    if ((bits & 0x7F800000) == 0x7F800000) continue;      // inf/NaN covered above
    if (i % 4 == 0) bits = (bits & 0xFFFF0000) | 0x8000;  // exact ties
    ASSERT_EQ(FloatToBf16(FromBits(bits)), NearestBf16(FromBits(bits))) << std::hex << bits;
  }
}

TEST(CpuDtype, Bf16RoundTripsEveryPattern) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_EQ(FloatToBf16(f), b | 0x40) << b;  // quieted, payload and sign kept
    } else {
      EXPECT_EQ(FloatToBf16(f), b) << b;
    }
  }
}

TEST(CpuDtype, RoundToBf16InPlace) {
  std::vector<float> x = {1.0f,    3.14159f, FromBits(0x3F818000),
                          -1e-30f, 65504.0f, std::numeric_limits<float>::infinity()};
  std::vector<float> want;
  for (float f : x) want.push_back(Bf16ToFloat(FloatToBf16(f)));
  RoundToBf16(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(x, want);
  EXPECT_EQ(x[1], 3.140625f);
}

// fp16 emulation keeps fp16's range: overflow to infinity (what fp16 loss
// scaling detects), underflow through subnormals to zero, ties to even.
TEST(CpuDtype, RoundToFp16InPlace) {
  std::vector<float> x = {1.0f, 3.14159f, 65504.0f, 65519.0f, 65520.0f, -1e6f, 1e-8f, 3e-8f, 1.0f + 0x1p-11f};
  RoundToFp16(x.data(), static_cast<int64_t>(x.size()));
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(x,
            (std::vector<float>{1.0f, 3.140625f, 65504.0f, 65504.0f, inf, -inf, 0.0f, 0x1p-25f * 2, 1.0f}));
}

TEST(CpuDtype, HalfKnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(0.5f), 0x3800);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);         // max half
  EXPECT_EQ(FloatToHalf(6.103515625e-5f), 0x0400);  // 2^-14, smallest normal
  EXPECT_EQ(FloatToHalf(5.96e-8f), 0x0001);         // smallest subnormal, 2^-24
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03FF), 1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
}

TEST(CpuDtype, HalfRoundsToNearestEven) {
  const float ulp1 = std::ldexp(1.0f, -10);             // spacing of halves in [1, 2)
  EXPECT_EQ(FloatToHalf(1.0f + ulp1 / 2), 0x3C00);      // tie, even below
  EXPECT_EQ(FloatToHalf(1.0f + 3 * ulp1 / 2), 0x3C02);  // tie, even above
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // tie past max: to even = inf
  const float sub = std::ldexp(1.0f, -24);
  EXPECT_EQ(FloatToHalf(sub / 2), 0x0000);  // tie at half the smallest subnormal: to 0
  EXPECT_EQ(FloatToHalf(sub * 0.50001f), 0x0001);
  EXPECT_EQ(FloatToHalf(sub * 1.5f), 0x0002);     // tie between 1 and 2 ulps
  EXPECT_EQ(FloatToHalf(sub * 2.5f), 0x0002);     // tie between 2 and 3 ulps
  EXPECT_EQ(FloatToHalf(sub * 1023.5f), 0x0400);  // largest subnormal rounds up to 2^-14
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalf(-sub * 0.4f), 0x8000);
}

TEST(CpuDtype, HalfSpecialValues) {
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7C00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
  EXPECT_EQ(FloatToHalf(FromBits(0x7F800001)) & 0x7E00, 0x7E00);  // NaN, quiet
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7C00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0xFC01)));
}

// The nearest half to f (finite, |f| < 65520) by binary search over the
// monotone positive patterns 0 ... 0x7BFF, ties to the even pattern.
uint16_t NearestHalf(float f) {
  const double a = std::abs(double(f));
  uint32_t lo = 0, hi = 0x7BFF;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (double(HalfToFloat(static_cast<uint16_t>(mid))) <= a ? lo : hi) = mid;
  }
  const double dlo = a - HalfToFloat(static_cast<uint16_t>(lo)),
               dhi = HalfToFloat(static_cast<uint16_t>(hi)) - a;
  uint32_t best = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  if (a >= HalfToFloat(0x7BFF)) best = 0x7BFF;
  return static_cast<uint16_t>(best | (std::signbit(f) ? 0x8000 : 0));
}

TEST(CpuDtype, HalfMatchesNearestValueSearch) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> exponent(-27.0f, 15.9f);
  for (int i = 0; i < 100000; ++i) {
    float f = std::exp2(exponent(rng)) * (rng() % 2 ? 1.0f : -1.0f);
    if (i % 4 == 0) {
      // An exact midpoint between two neighbouring halves.
      const uint16_t h = FloatToHalf(f) & 0x7FFF;
      if (h >= 0x7BFF) continue;
      f = std::copysign((HalfToFloat(h) + HalfToFloat(static_cast<uint16_t>(h + 1))) / 2, f);
    }
    ASSERT_EQ(FloatToHalf(f), NearestHalf(f)) << f;
  }
}

TEST(CpuDtype, HalfRoundTripsEveryPattern) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(FloatToHalf(f), h | 0x0200) << h;  // quieted, payload and sign kept
    } else {
      EXPECT_EQ(FloatToHalf(f), h) << h;
    }
  }
}

}  // namespace
}  // namespace ft::cpu
