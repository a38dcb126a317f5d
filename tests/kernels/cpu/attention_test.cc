// Flash attention (tiled, online softmax) against the naive form and against
// an independent materialised-softmax backward written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/kernels/cpu/test_util.h"

namespace ft::cpu {
namespace {

using test_util::ExpectClose;
using test_util::Random;

template <typename T>
struct Inputs {
  AttentionShape shape;
  std::vector<T> q, k, v;
  std::vector<int32_t> segments;  // empty: no segments
  const int32_t* seg() const { return segments.empty() ? nullptr : segments.data(); }
};

// Packed documents of uneven lengths (3, 7, 1, 11, ...) per batch element.
std::vector<int32_t> PackedSegments(int64_t batch, int64_t seq) {
  std::vector<int32_t> seg(batch * seq);
  const int lengths[] = {3, 7, 1, 11, 64, 5};
  for (int64_t b = 0; b < batch; ++b) {
    int32_t id = 0;
    int left = lengths[b % 6];
    for (int64_t i = 0; i < seq; ++i) {
      if (left-- == 0) left = lengths[++id % 6] - 1;
      seg[b * seq + i] = id;
    }
  }
  return seg;
}

template <typename T>
Inputs<T> MakeInputs(int64_t batch, int64_t seq, int64_t hq, int64_t hkv, int64_t hd, bool segments,
                     uint32_t seed) {
  Inputs<T> in;
  in.shape = {batch, seq, hq, hkv, hd, 1.0 / std::sqrt(static_cast<double>(hd))};
  const int64_t rows = batch * seq;
  // Scores of a few units: the running max moves often, rescaling is exercised.
  in.q = Random<T>(rows * hq * hd, seed, -3, 3);
  in.k = Random<T>(rows * hkv * hd, seed + 1, -3, 3);
  in.v = Random<T>(rows * hkv * hd, seed + 2);
  if (segments) in.segments = PackedSegments(batch, seq);
  return in;
}

std::string Describe(const AttentionShape& s, bool segments) {
  return "batch " + std::to_string(s.batch) + " seq " + std::to_string(s.seq) + " Hq " +
         std::to_string(s.q_heads) + " Hkv " + std::to_string(s.kv_heads) + " hd " +
         std::to_string(s.head_dim) + (segments ? " segments" : "") + " window " + std::to_string(s.window) +
         " softcap " + std::to_string(s.softcap);
}

// The flash forward against the naive one on `in`. Outputs (averages of values in [-1, 1]) and
// lse (scores of a few units) are O(1): the tolerance has an absolute floor of the same size.
template <typename T>
void ExpectFlashMatchesNaive(const Inputs<T>& in, double tol) {
  const AttentionShape& s = in.shape;
  std::vector<T> out(in.q.size()), lse(s.batch * s.q_heads * s.seq), ref_out(out.size()), ref_lse(lse.size());
  AttentionForward(s, in.q.data(), in.k.data(), in.v.data(), in.seg(), out.data(), lse.data());
  AttentionForwardNaive(s, in.q.data(), in.k.data(), in.v.data(), in.seg(), ref_out.data(), ref_lse.data());
  ExpectClose(out, ref_out, tol, tol, "out");
  ExpectClose(lse, ref_lse, tol, tol, "lse");
}

template <typename T>
class CpuAttention : public ::testing::Test {
 protected:
  static constexpr double kTol = sizeof(T) == 4 ? 1e-5 : 1e-12;
};
using ScalarTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CpuAttention, ScalarTypes);

TYPED_TEST(CpuAttention, FlashMatchesNaiveOnRandomShapes) {
  using T = TypeParam;
  uint32_t seed = 100;
  for (int64_t batch : {1, 2}) {
    for (int64_t seq : {1, 5, 63, 64, 65, 130}) {
      for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {3, 1}}) {
        for (int64_t hd : {16, 64}) {
          for (bool segments : {false, true}) {
            const auto in = MakeInputs<T>(batch, seq, hq, hkv, hd, segments, seed += 3);
            SCOPED_TRACE(Describe(in.shape, segments));
            ExpectFlashMatchesNaive(in, this->kTol);
          }
        }
      }
    }
  }
}

// Sliding windows across tile boundaries (1 key, less than a tile, a tile,
// more) and soft-capping, alone and together, with and without segments.
TYPED_TEST(CpuAttention, FlashMatchesNaiveWithSlidingWindowAndSoftCap) {
  using T = TypeParam;
  uint32_t seed = 500;
  for (int64_t seq : {65, 130}) {
    for (int64_t window : {0, 1, 17, 64, 100}) {
      for (double softcap : {0.0, 2.0}) {
        for (bool segments : {false, true}) {
          auto in = MakeInputs<T>(2, seq, 4, 2, 16, segments, seed += 3);
          in.shape.window = window;
          in.shape.softcap = softcap;
          SCOPED_TRACE(Describe(in.shape, segments));
          ExpectFlashMatchesNaive(in, this->kTol);
        }
      }
    }
  }
}

// A window of one key: every query copies its own value (lse = its capped
// score); a window at least the sequence long changes nothing.
TYPED_TEST(CpuAttention, WindowOfOneCopiesTheValueAndAWholeWindowIsNoWindow) {
  using T = TypeParam;
  auto in = MakeInputs<T>(1, 70, 2, 2, 16, false, 77);
  std::vector<T> out(in.q.size()), lse(2 * 70), full(out.size()), full_lse(lse.size());
  in.shape.window = 1;
  AttentionForward(in.shape, in.q.data(), in.k.data(), in.v.data(), nullptr, out.data(), lse.data());
  ExpectClose(out, in.v, this->kTol, this->kTol, "window 1 out");
  in.shape.window = 0;
  AttentionForward(in.shape, in.q.data(), in.k.data(), in.v.data(), nullptr, full.data(), full_lse.data());
  in.shape.window = 70;
  AttentionForward(in.shape, in.q.data(), in.k.data(), in.v.data(), nullptr, out.data(), lse.data());
  EXPECT_EQ(out, full);
  EXPECT_EQ(lse, full_lse);
}

// Decoding with a KV cache (kv_seq > seq): the last `seq` queries against all
// keys give the last rows of the full attention, in the flash and naive forms.
TYPED_TEST(CpuAttention, QueriesAfterCachedKeysAreTheLastRowsOfFullAttention) {
  using T = TypeParam;
  const int64_t hq = 4, hkv = 2, hd = 16;
  for (int64_t keys : {1, 7, 64, 65, 150}) {
    for (int64_t seq : {int64_t{1}, std::min<int64_t>(keys, 33)}) {
      for (int64_t window : {0, 5, 40}) {
        auto in = MakeInputs<T>(2, keys, hq, hkv, hd, false, static_cast<uint32_t>(keys * 7 + seq));
        in.shape.window = window;
        SCOPED_TRACE("keys " + std::to_string(keys) + " queries " + std::to_string(seq) + " window " +
                     std::to_string(window));
        std::vector<T> full(in.q.size()), full_lse(2 * hq * keys);
        AttentionForwardNaive(in.shape, in.q.data(), in.k.data(), in.v.data(), nullptr, full.data(),
                              full_lse.data());
        // The last `seq` queries of each sequence, as a decode step sees them.
        AttentionShape s = in.shape;
        s.seq = seq;
        s.kv_seq = keys;
        const int64_t width = hq * hd, past = keys - seq;
        std::vector<T> q, want, want_lse;
        for (int64_t b = 0; b < 2; ++b) {
          q.insert(q.end(), in.q.begin() + (b * keys + past) * width, in.q.begin() + (b + 1) * keys * width);
          want.insert(want.end(), full.begin() + (b * keys + past) * width,
                      full.begin() + (b + 1) * keys * width);
          for (int64_t h = 0; h < hq; ++h) {
            const auto row = full_lse.begin() + (b * hq + h) * keys;
            want_lse.insert(want_lse.end(), row + past, row + keys);
          }
        }
        for (const bool naive : {false, true}) {
          std::vector<T> out(q.size()), lse(2 * hq * seq);
          (naive ? AttentionForwardNaive<T> : AttentionForward<T>)(s, q.data(), in.k.data(), in.v.data(),
                                                                   nullptr, out.data(), lse.data());
          ExpectClose(out, want, this->kTol, this->kTol, naive ? "naive out" : "flash out");
          ExpectClose(lse, want_lse, this->kTol, this->kTol, naive ? "naive lse" : "flash lse");
        }
      }
    }
  }
}

TYPED_TEST(CpuAttention, FirstTokenOfEachSegmentCopiesItsValue) {
  using T = TypeParam;
  const auto in = MakeInputs<T>(2, 40, 2, 1, 16, true, 7);
  const AttentionShape& s = in.shape;
  std::vector<T> out(2 * 40 * 2 * 16), lse(2 * 2 * 40);
  AttentionForward(s, in.q.data(), in.k.data(), in.v.data(), in.seg(), out.data(), lse.data());
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.seq; ++i) {
      const int64_t row = b * s.seq + i;
      if (i > 0 && in.segments[row] == in.segments[row - 1]) continue;
      for (int64_t h = 0; h < s.q_heads; ++h) {
        double score = 0;
        for (int64_t d = 0; d < 16; ++d) score += double(in.q[(row * 2 + h) * 16 + d]) * in.k[row * 16 + d];
        EXPECT_NEAR(lse[(b * 2 + h) * s.seq + i], score * s.scale, 10 * this->kTol) << "row " << row;
        for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(out[(row * 2 + h) * 16 + d], in.v[row * 16 + d]);
      }
    }
  }
}

TYPED_TEST(CpuAttention, PackedSegmentsEqualSeparateSequences) {
  using T = TypeParam;
  // One row holding documents of lengths 3 and 5 == a batch of the two alone.
  const int64_t hq = 4, hkv = 2, hd = 16;
  auto packed = MakeInputs<T>(1, 8, hq, hkv, hd, false, 9);
  packed.segments = {4, 4, 4, 9, 9, 9, 9, 9};
  std::vector<T> out(8 * hq * hd), lse(hq * 8);
  AttentionForward(packed.shape, packed.q.data(), packed.k.data(), packed.v.data(), packed.seg(), out.data(),
                   lse.data());
  for (const auto& doc : {std::pair<int64_t, int64_t>{0, 3}, {3, 5}}) {
    const int64_t start = doc.first, len = doc.second;  // plain names: lambdas capture them
    AttentionShape s = packed.shape;
    s.seq = len;
    auto slice = [&](const std::vector<T>& x, int64_t heads) {
      return std::vector<T>(x.begin() + start * heads * hd, x.begin() + (start + len) * heads * hd);
    };
    const auto q = slice(packed.q, hq), k = slice(packed.k, hkv), v = slice(packed.v, hkv);
    std::vector<T> doc_out(len * hq * hd), doc_lse(hq * len), want_lse(hq * len);
    AttentionForward(s, q.data(), k.data(), v.data(), nullptr, doc_out.data(), doc_lse.data());
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t i = 0; i < len; ++i) want_lse[h * len + i] = lse[h * 8 + start + i];
    }
    ExpectClose(slice(out, hq), doc_out, this->kTol, this->kTol,
                "out of document at " + std::to_string(start));
    ExpectClose(want_lse, doc_lse, this->kTol, this->kTol, "lse of document at " + std::to_string(start));
  }
}

// HF's repeat_kv: kv head j serves query heads j*group ... j*group + group-1.
template <typename T>
std::vector<T> RepeatKv(const std::vector<T>& x, int64_t rows, int64_t hkv, int64_t group, int64_t hd) {
  std::vector<T> out(rows * hkv * group * hd);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < hkv * group; ++h) {
      for (int64_t d = 0; d < hd; ++d)
        out[(r * hkv * group + h) * hd + d] = x[(r * hkv + h / group) * hd + d];
    }
  }
  return out;
}

TYPED_TEST(CpuAttention, GqaEqualsMhaWithRepeatedKv) {
  using T = TypeParam;
  const int64_t batch = 2, seq = 70, hq = 6, hkv = 2, group = 3, hd = 16, rows = batch * seq;
  const auto gqa = MakeInputs<T>(batch, seq, hq, hkv, hd, true, 21);
  AttentionShape mha_shape = gqa.shape;
  mha_shape.kv_heads = hq;
  const auto k = RepeatKv(gqa.k, rows, hkv, group, hd), v = RepeatKv(gqa.v, rows, hkv, group, hd);
  const auto dout = Random<T>(rows * hq * hd, 22);

  std::vector<T> out(rows * hq * hd), lse(batch * hq * seq), mha_out(out.size()), mha_lse(lse.size());
  AttentionForward(gqa.shape, gqa.q.data(), gqa.k.data(), gqa.v.data(), gqa.seg(), out.data(), lse.data());
  AttentionForward(mha_shape, gqa.q.data(), k.data(), v.data(), gqa.seg(), mha_out.data(), mha_lse.data());
  EXPECT_EQ(out, mha_out);  // the same numbers in the same order
  EXPECT_EQ(lse, mha_lse);

  std::vector<T> dq(out.size()), dk(gqa.k.size()), dv(gqa.v.size());
  std::vector<T> mha_dq(out.size()), mha_dk(k.size()), mha_dv(v.size());
  AttentionBackward(gqa.shape, gqa.q.data(), gqa.k.data(), gqa.v.data(), gqa.seg(), out.data(), lse.data(),
                    dout.data(), dq.data(), dk.data(), dv.data());
  AttentionBackward(mha_shape, gqa.q.data(), k.data(), v.data(), gqa.seg(), out.data(), lse.data(),
                    dout.data(), mha_dq.data(), mha_dk.data(), mha_dv.data());
  EXPECT_EQ(dq, mha_dq);
  // The kv head's gradient is the sum over the query heads sharing it.
  std::vector<T> sum_dk(dk.size(), T(0)), sum_dv(dv.size(), T(0));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t d = 0; d < hd; ++d) {
        sum_dk[(r * hkv + h / group) * hd + d] += mha_dk[(r * hq + h) * hd + d];
        sum_dv[(r * hkv + h / group) * hd + d] += mha_dv[(r * hq + h) * hd + d];
      }
    }
  }
  ExpectClose(dk, sum_dk, 10 * this->kTol, this->kTol, "dk");
  ExpectClose(dv, sum_dv, 10 * this->kTol, this->kTol, "dv");
}

// Textbook backward in double through the full probability matrix:
// P = softmax(S), dP = dout Vᵀ, dS = P ∘ (dP - rowsum(P ∘ dP)).
void ReferenceBackward(const Inputs<double>& in, const std::vector<double>& dout, std::vector<double>& dq,
                       std::vector<double>& dk, std::vector<double>& dv) {
  const AttentionShape& s = in.shape;
  const int64_t L = s.seq, hd = s.head_dim, hq = s.q_heads, hkv = s.kv_heads, group = hq / hkv;
  dq.assign(in.q.size(), 0);
  dk.assign(in.k.size(), 0);
  dv.assign(in.v.size(), 0);
  auto qi = [&](int64_t b, int64_t h, int64_t i) { return ((b * L + i) * hq + h) * hd; };
  auto kj = [&](int64_t b, int64_t h, int64_t j) { return ((b * L + j) * hkv + h / group) * hd; };
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      std::vector<double> P(L * L, 0.0), dP(L * L, 0.0);
      std::vector<double> dcap(L * L, 1.0);  // d(capped score) / d(scaled score)
      for (int64_t i = 0; i < L; ++i) {
        double mx = -INFINITY, sum = 0;
        auto visible = [&](int64_t j) {
          return (s.window == 0 || i - j < s.window) &&
                 (!in.seg() || in.segments[b * L + j] == in.segments[b * L + i]);
        };
        for (int64_t j = 0; j <= i; ++j) {
          if (!visible(j)) continue;
          double dot = 0, dpd = 0;
          for (int64_t d = 0; d < hd; ++d) {
            dot += in.q[qi(b, h, i) + d] * in.k[kj(b, h, j) + d];
            dpd += dout[qi(b, h, i) + d] * in.v[kj(b, h, j) + d];
          }
          double score = dot * s.scale;
          if (s.softcap > 0) {
            const double t = std::tanh(score / s.softcap);
            score = s.softcap * t;
            dcap[i * L + j] = 1 - t * t;
          }
          P[i * L + j] = score;
          dP[i * L + j] = dpd;
          mx = std::max(mx, score);
        }
        for (int64_t j = 0; j <= i; ++j) {
          P[i * L + j] = visible(j) ? std::exp(P[i * L + j] - mx) : 0.0;
          sum += P[i * L + j];
        }
        double row_dot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          P[i * L + j] /= sum;
          row_dot += P[i * L + j] * dP[i * L + j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double p = P[i * L + j], ds = p * (dP[i * L + j] - row_dot) * dcap[i * L + j];
          for (int64_t d = 0; d < hd; ++d) {
            dq[qi(b, h, i) + d] += s.scale * ds * in.k[kj(b, h, j) + d];
            dk[kj(b, h, j) + d] += s.scale * ds * in.q[qi(b, h, i) + d];
            dv[kj(b, h, j) + d] += p * dout[qi(b, h, i) + d];
          }
        }
      }
    }
  }
}

// The flash backward (after the flash forward) against ReferenceBackward, for a random dout.
void ExpectBackwardMatchesReference(const Inputs<double>& in, uint32_t dout_seed) {
  const AttentionShape& s = in.shape;
  const auto dout = Random<double>(in.q.size(), dout_seed);
  std::vector<double> out(in.q.size()), lse(s.batch * s.q_heads * s.seq), dq(in.q.size()), dk(in.k.size()),
      dv(in.v.size());
  AttentionForward(s, in.q.data(), in.k.data(), in.v.data(), in.seg(), out.data(), lse.data());
  AttentionBackward(s, in.q.data(), in.k.data(), in.v.data(), in.seg(), out.data(), lse.data(), dout.data(),
                    dq.data(), dk.data(), dv.data());
  std::vector<double> ref_dq, ref_dk, ref_dv;
  ReferenceBackward(in, dout, ref_dq, ref_dk, ref_dv);
  ExpectClose(dq, ref_dq, 1e-11, 1e-12, "dq");
  ExpectClose(dk, ref_dk, 1e-11, 1e-12, "dk");
  ExpectClose(dv, ref_dv, 1e-11, 1e-12, "dv");
}

TEST(CpuAttentionBackward, MatchesMaterialisedSoftmaxAcrossTiles) {
  for (int64_t seq : {1, 17, 64, 65, 130}) {
    for (bool segments : {false, true}) {
      const auto in = MakeInputs<double>(2, seq, 4, 2, 16, segments, 31 + seq);
      SCOPED_TRACE(Describe(in.shape, segments));
      ExpectBackwardMatchesReference(in, 32);
    }
  }
}

TEST(CpuAttentionBackward, MatchesMaterialisedSoftmaxWithSlidingWindowAndSoftCap) {
  for (int64_t window : {1, 37, 70}) {
    for (double softcap : {0.0, 2.0}) {
      for (bool segments : {false, true}) {
        auto in = MakeInputs<double>(2, 130, 4, 2, 16, segments, 61 + window);
        in.shape.window = window;
        in.shape.softcap = softcap;
        SCOPED_TRACE(Describe(in.shape, segments));
        ExpectBackwardMatchesReference(in, 62);
      }
    }
  }
}

TEST(CpuAttentionBackward, FloatMatchesDouble) {
  const auto in = MakeInputs<double>(1, 100, 4, 2, 64, true, 41);
  const auto dout = Random<double>(in.q.size(), 42);
  std::vector<double> out(in.q.size()), lse(4 * 100), dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  AttentionForward(in.shape, in.q.data(), in.k.data(), in.v.data(), in.seg(), out.data(), lse.data());
  AttentionBackward(in.shape, in.q.data(), in.k.data(), in.v.data(), in.seg(), out.data(), lse.data(),
                    dout.data(), dq.data(), dk.data(), dv.data());
  auto to_float = [](const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); };
  const auto qf = to_float(in.q), kf = to_float(in.k), vf = to_float(in.v), doutf = to_float(dout);
  std::vector<float> outf(out.size()), lsef(lse.size()), dqf(dq.size()), dkf(dk.size()), dvf(dv.size());
  AttentionForward(in.shape, qf.data(), kf.data(), vf.data(), in.seg(), outf.data(), lsef.data());
  AttentionBackward(in.shape, qf.data(), kf.data(), vf.data(), in.seg(), outf.data(), lsef.data(),
                    doutf.data(), dqf.data(), dkf.data(), dvf.data());
  ExpectClose(outf, to_float(out), 1e-5, 1e-5, "out");
  ExpectClose(dqf, to_float(dq), 1e-4, 1e-5, "dq");
  ExpectClose(dkf, to_float(dk), 1e-4, 1e-5, "dk");
  ExpectClose(dvf, to_float(dv), 1e-4, 1e-5, "dv");
}

}  // namespace
}  // namespace ft::cpu
