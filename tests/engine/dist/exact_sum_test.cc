// Order-independent sums (engine/dist/exact_sum.h): the same bits whatever
// the order of the values and however they are split across ranks (Gloo on
// loopback, a thread per rank), close to the true sum, and a NaN or infinity
// anywhere is NaN everywhere. fp32's own sums are the counterexample each
// test starts from, so a test that passes shows a difference.
#include "engine/dist/exact_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "tests/support/loopback_ranks.h"

namespace ft {
namespace {

constexpr int64_t kElements = 4099;  // not a multiple of anything
constexpr int kVectors = 24;         // divisible by 1, 2, 3, 4, 6, 8

// Gradient-like vectors: mixed signs, magnitudes over 2^-40 .. 2^12 (some elements spread over
// the whole range, so windows move by one bin and by several), a few subnormals and zeros.
std::vector<std::vector<float>> Vectors(uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> unit(-1, 1);
  std::uniform_int_distribution<int> exponent(-40, 12);
  std::vector<std::vector<float>> v(kVectors, std::vector<float>(kElements));
  for (int i = 0; i < kVectors; ++i) {
    for (int64_t k = 0; k < kElements; ++k) {
      const int e = k % 3 == 0 ? exponent(rng) : static_cast<int>(k % 17) - 8;  // wide or narrow
      v[i][k] = static_cast<float>(std::ldexp(unit(rng), e));
      if (k % 101 == 0) v[i][k] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i + 1);
      if (k % 97 == 0 && i % 2 == 0) v[i][k] = 0;
    }
  }
  return v;
}

std::vector<float> Rounded(const ExactSum<float>& s) {
  std::vector<float> out(static_cast<size_t>(s.size()));
  s.Round(out.data());
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The vectors in `order`, summed in one accumulator.
std::vector<float> SumInOrder(const std::vector<std::vector<float>>& v, const std::vector<int>& order) {
  ExactSum<float> s(kElements);
  for (int i : order) s.Add(v[static_cast<size_t>(i)].data());
  return Rounded(s);
}

// The vectors split over `world` ranks (rank r: the r-th contiguous block when `contiguous`,
// else every world-th from r), each rank summing its own, then all-reduced. Every rank's result.
std::vector<std::vector<float>> SumOnRanks(const std::vector<std::vector<float>>& v, int world,
                                           bool contiguous) {
  std::vector<std::vector<float>> results(static_cast<size_t>(world));
  testing_support::OnLoopbackRanks(world, [&](int r, Collective& ranks) {
    ExactSum<float> s(kElements);
    const int per = kVectors / world;
    for (int i = 0; i < per; ++i)
      s.Add(v[static_cast<size_t>(contiguous ? r * per + i : i * world + r)].data());
    ASSERT_TRUE(s.AllReduce(&ranks).ok());
    results[static_cast<size_t>(r)] = Rounded(s);
  });
  return results;
}

TEST(ExactSumTest, AnyOrderGivesTheSameBitsWhereFloatSumsDoNot) {
  const auto v = Vectors(1);
  std::vector<int> order(kVectors);
  std::iota(order.begin(), order.end(), 0);
  const std::vector<float> first = SumInOrder(v, order);
  std::mt19937 rng(7);
  bool float_differs = false;
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<int> shuffled = order;
    if (trial == 1) std::reverse(shuffled.begin(), shuffled.end());
    if (trial > 1) std::shuffle(shuffled.begin(), shuffled.end(), rng);
    EXPECT_TRUE(SameBits(SumInOrder(v, shuffled), first)) << "order " << trial;
    for (int64_t k = 0; k < kElements && !float_differs; ++k) {
      float a = 0, b = 0;
      for (int i : order) a += v[static_cast<size_t>(i)][k];
      for (int i : shuffled) b += v[static_cast<size_t>(i)][k];
      float_differs = a != b;
    }
  }
  EXPECT_TRUE(float_differs) << "the data should be one where fp32's order matters";
}

TEST(ExactSumTest, OneTwoThreeFourSixAndEightRanksGiveTheBitsOfOne) {
  const auto v = Vectors(2);
  std::vector<int> order(kVectors);
  std::iota(order.begin(), order.end(), 0);
  const std::vector<float> one = SumInOrder(v, order);
  for (int world : {1, 2, 3, 4, 6, 8}) {
    for (bool contiguous : {true, false}) {
      SCOPED_TRACE("world " + std::to_string(world) + (contiguous ? ", blocks" : ", interleaved"));
      const auto results = SumOnRanks(v, world, contiguous);
      for (int r = 0; r < world; ++r)
        EXPECT_TRUE(SameBits(results[static_cast<size_t>(r)], one)) << "rank " << r;
    }
  }
}

TEST(ExactSumTest, TheSumIsTheTrueSumRoundedOnceWhereFloatSumsAreNot) {
  const auto v = Vectors(3);
  std::vector<int> order(kVectors);
  std::iota(order.begin(), order.end(), 0);
  const std::vector<float> got = SumInOrder(v, order);
  int64_t exact = 0, float_exact = 0;
  for (int64_t k = 0; k < kElements; ++k) {
    long double truth = 0;  // 64-bit mantissa; the values here span ~2^52, so sort to add them well
    std::vector<long double> parts;
    float max = 0, naive = 0;
    for (const auto& x : v) {
      parts.push_back(x[k]);
      max = std::max(max, std::fabs(x[k]));
      naive += x[k];
    }
    std::sort(parts.begin(), parts.end(),
              [](long double a, long double b) { return std::fabs(a) < std::fabs(b); });
    for (long double p : parts) truth += p;
    const auto want = static_cast<float>(truth);
    exact += got[k] == want;
    float_exact += naive == want;
    // At most the truncation (24 values, each under 2^-40 of the largest) and one rounding.
    const double bound = kVectors * std::ldexp(max, -40) + std::fabs(static_cast<double>(want)) * 0x1p-24;
    EXPECT_LE(std::fabs(static_cast<double>(got[k]) - static_cast<double>(truth)), bound) << "element " << k;
  }
  std::printf("correctly rounded sums: exact sum %lld of %lld, fp32 in order %lld\n",
              static_cast<long long>(exact), static_cast<long long>(kElements),
              static_cast<long long>(float_exact));
  EXPECT_GE(exact, kElements * 99 / 100);
  EXPECT_GT(exact, float_exact);
}

TEST(ExactSumTest, ANaNOrInfinityOnOneRankIsNaNOnEveryRank) {
  auto v = Vectors(4);
  v[5][10] = std::numeric_limits<float>::infinity();
  v[17][11] = std::numeric_limits<float>::quiet_NaN();
  for (const auto& result : SumOnRanks(v, 4, true)) {
    EXPECT_TRUE(std::isnan(result[10]));
    EXPECT_TRUE(std::isnan(result[11]));
    EXPECT_TRUE(std::isfinite(result[12]));
  }
}

// The trainer's one-term step (one rank, one micro-batch: Trainer::OneTermGradientSum) keeps the
// gradients on the device instead of folding them: it relies on the sum of one vector being that
// vector bit for bit, every float (subnormals, the largest, both signs, every magnitude of
// Vectors) lying on the sum's grid, with -0 the only value that comes back changed (to +0).
TEST(ExactSumTest, TheSumOfOneVectorIsItsBitsWithMinusZeroMadePositive) {
  std::vector<float> x = Vectors(7)[3];
  x.insert(x.end(),
           {-0.0f, 0.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
            std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
            -std::numeric_limits<float>::max(), 1.0f, -3.0e-38f, 6.5e37f});
  ExactSum<float> s(static_cast<int64_t>(x.size()));
  s.Add(x.data());
  std::vector<float> out(x.size());
  s.Round(out.data());
  int minus_zeros = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = x[i] == 0.0f ? 0.0f : x[i];  // +0 for either zero
    minus_zeros += std::signbit(x[i]) && x[i] == 0.0f;
    EXPECT_EQ(std::memcmp(&out[i], &want, sizeof(float)), 0) << i << ": " << x[i] << " came back " << out[i];
  }
  EXPECT_GE(minus_zeros, 1);
}

TEST(ExactSumTest, ASumPastFloatsRangeIsInfinite) {
  const float big = std::numeric_limits<float>::max();
  ExactSum<float> s(2);
  const float a[2] = {big, -big}, b[2] = {big, -big * 0.5f};
  s.Add(a);
  s.Add(b);
  float out[2] = {0, 0};
  s.Round(out);
  EXPECT_EQ(out[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[1], -std::numeric_limits<float>::infinity());
}

TEST(ExactSumTest, DoublesToo) {
  // Loss sums: 1 + 2^-60 then -1 gives 2^-60 exactly, in any order (a double sum in this order: 0).
  const std::vector<std::vector<double>> v = {{1.0}, {std::ldexp(1.0, -60)}, {-1.0}};
  for (const std::vector<int>& order : std::vector<std::vector<int>>{{0, 1, 2}, {2, 1, 0}, {1, 0, 2}}) {
    ExactSum<double> s(1);
    for (int i : order) s.Add(v[static_cast<size_t>(i)].data());
    double out = -1;
    s.Round(&out);
    EXPECT_EQ(out, std::ldexp(1.0, -60));
  }
  EXPECT_EQ((1.0 + std::ldexp(1.0, -60)) - 1.0, 0.0);
  ExactSum<double> empty(2);
  double out[2] = {5, 5};
  empty.Round(out);
  EXPECT_EQ(out[0], 0.0);
  EXPECT_EQ(out[1], 0.0);
}

}  // namespace
}  // namespace ft
