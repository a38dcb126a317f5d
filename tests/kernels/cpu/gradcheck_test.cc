// Finite-difference checks, in double, of every backward in kernels/cpu. Each
// op is scored with L = Σ out * w for fixed random weights w, so dL/dout = w.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "tests/kernels/cpu/test_util.h"

namespace ft::cpu {
namespace {

using test_util::Dot;
using test_util::ExpectGradMatchesFiniteDifferences;
using test_util::Random;
using Vec = std::vector<double>;

TEST(CpuGradCheck, RmsNormBackwardGivesDxAndAccumulatesDw) {
  const int64_t rows = 3, D = 7;
  const double eps = 1e-5;
  Vec x = Random<double>(rows * D, 1), w = Random<double>(D, 2, 0.5, 1.5);
  const Vec weights = Random<double>(rows * D, 3);
  auto loss = [&] {
    Vec y(rows * D), rstd(rows);
    RmsNormForward(x.data(), w.data(), rows, D, eps, y.data(), rstd.data());
    return Dot(y, weights);
  };
  Vec y(rows * D), rstd(rows), dx(rows * D);
  RmsNormForward(x.data(), w.data(), rows, D, eps, y.data(), rstd.data());
  const Vec dw0 = Random<double>(D, 4);  // dw accumulates: start from non-zero
  Vec dw = dw0;
  RmsNormBackward(x.data(), w.data(), rstd.data(), weights.data(), rows, D, dx.data(), dw.data());
  for (int64_t j = 0; j < D; ++j) dw[j] -= dw0[j];
  ExpectGradMatchesFiniteDifferences(dx, x, loss, "dx");
  ExpectGradMatchesFiniteDifferences(dw, w, loss, "dw");

  // dw == nullptr skips the weight gradient and leaves dx unchanged.
  Vec dx2(rows * D);
  RmsNormBackward(x.data(), w.data(), rstd.data(), weights.data(), rows, D, dx2.data(),
                  static_cast<double*>(nullptr));
  EXPECT_EQ(dx2, dx);
}

// cos/sin tables for positions [0, max_pos) with HF's inv_freq = base^(-2i/hd).
void RopeTables(int64_t max_pos, int64_t hd, Vec& cos_t, Vec& sin_t) {
  const int64_t half = hd / 2;
  cos_t.resize(max_pos * half);
  sin_t.resize(max_pos * half);
  for (int64_t p = 0; p < max_pos; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = p * std::pow(10000.0, -2.0 * i / hd);
      cos_t[p * half + i] = std::cos(angle);
      sin_t[p * half + i] = std::sin(angle);
    }
  }
}

TEST(CpuGradCheck, RopeInverseIsTheTransposeAndTheGradient) {
  const int64_t rows = 4, heads = 3, hd = 8;
  const std::vector<int32_t> pos = {0, 5, 2, 11};
  Vec cos_t, sin_t;
  RopeTables(12, hd, cos_t, sin_t);
  Vec x = Random<double>(rows * heads * hd, 5);
  const Vec dy = Random<double>(rows * heads * hd, 6);
  auto rotate = [&](Vec v, bool inverse) {
    RopeApply(v.data(), rows, heads, hd, pos.data(), cos_t.data(), sin_t.data(), inverse);
    return v;
  };
  // Adjoint identity <dy, R x> = <Rᵀ dy, x>.
  EXPECT_NEAR(Dot(dy, rotate(x, false)), Dot(rotate(dy, true), x), 1e-12);
  // Rᵀ R = I.
  test_util::ExpectClose(rotate(rotate(x, false), true), x, 1e-14, 1e-15, "inverse(forward(x))");
  ExpectGradMatchesFiniteDifferences(
      rotate(dy, true), x, [&] { return Dot(rotate(x, false), dy); }, "dx");
}

struct AttentionCase {
  int64_t batch, seq, q_heads, kv_heads;
  bool segments;
  int64_t window = 0;  // AttentionShape's sliding window and soft-cap
  double softcap = 0;
};

std::string Describe(const AttentionCase& c) {
  return "batch " + std::to_string(c.batch) + " seq " + std::to_string(c.seq) + " Hq " +
         std::to_string(c.q_heads) + " Hkv " + std::to_string(c.kv_heads) +
         (c.segments ? " with segments" : " without segments") + " window " + std::to_string(c.window) +
         " softcap " + std::to_string(c.softcap);
}

// Packed documents: each batch element holds runs of segment ids, one of them
// non-contiguous (ids may repeat after a gap; only equality matters).
std::vector<int32_t> TestSegments(int64_t batch, int64_t seq) {
  std::vector<int32_t> seg(batch * seq);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < seq; ++i)
      seg[b * seq + i] = static_cast<int32_t>(b == 0 ? i / 3 : (i / 2) % 3 + 7);
  }
  return seg;
}

void CheckAttentionGradients(const AttentionCase& c) {
  SCOPED_TRACE(Describe(c));
  const int64_t hd = 8, rows = c.batch * c.seq;
  AttentionShape s{c.batch, c.seq, c.q_heads, c.kv_heads, hd, 1.0 / std::sqrt(double(hd))};
  s.window = c.window;
  s.softcap = c.softcap;
  Vec q = Random<double>(rows * c.q_heads * hd, 11, -2, 2);
  Vec k = Random<double>(rows * c.kv_heads * hd, 12, -2, 2);
  Vec v = Random<double>(rows * c.kv_heads * hd, 13);
  const Vec weights = Random<double>(rows * c.q_heads * hd, 14);
  const std::vector<int32_t> seg_ids = TestSegments(c.batch, c.seq);
  const int32_t* seg = c.segments ? seg_ids.data() : nullptr;
  Vec out(q.size()), lse(c.batch * c.q_heads * c.seq);
  auto loss = [&] {
    AttentionForward(s, q.data(), k.data(), v.data(), seg, out.data(), lse.data());
    return Dot(out, weights);
  };
  loss();
  Vec dq(q.size()), dk(k.size()), dv(v.size());
  AttentionBackward(s, q.data(), k.data(), v.data(), seg, out.data(), lse.data(), weights.data(), dq.data(),
                    dk.data(), dv.data());
  ExpectGradMatchesFiniteDifferences(dq, q, loss, "dq");
  ExpectGradMatchesFiniteDifferences(dk, k, loss, "dk");
  ExpectGradMatchesFiniteDifferences(dv, v, loss, "dv");
}

TEST(CpuGradCheck, AttentionBackwardGqaCausalOddLengths) {
  for (int64_t seq : {7, 13}) {
    for (bool segments : {false, true}) CheckAttentionGradients({2, seq, 4, 2, segments});
  }
}

TEST(CpuGradCheck, AttentionBackwardMhaAndSingleKvHead) {
  CheckAttentionGradients({1, 13, 2, 2, false});
  CheckAttentionGradients({1, 7, 3, 1, true});
}

// A sliding window shorter than the sequence (and than a segment), and
// soft-capping tight enough that tanh bends the scores (|x| reaches ~2 x cap).
TEST(CpuGradCheck, AttentionBackwardSlidingWindowAndSoftCap) {
  CheckAttentionGradients({2, 13, 4, 2, false, 4, 0});
  CheckAttentionGradients({2, 13, 4, 2, true, 2, 0});
  CheckAttentionGradients({2, 13, 4, 2, false, 0, 1.5});
  CheckAttentionGradients({1, 13, 3, 1, true, 5, 1.5});
}

// A gated activation's backward (SwiGLU, GeGLU-tanh) against central differences of its forward,
// and in place (dgate over gate, dup over up).
template <typename Forward, typename Backward>
void CheckGluGradients(Forward forward, Backward backward) {
  const int64_t n = 40;
  Vec gate = Random<double>(n, 21, -6, 6), up = Random<double>(n, 22, -2, 2);
  const Vec weights = Random<double>(n, 23);
  auto loss = [&] {
    Vec h(n);
    forward(gate.data(), up.data(), n, h.data());
    return Dot(h, weights);
  };
  Vec dgate(n), dup(n);
  backward(gate.data(), up.data(), weights.data(), n, dgate.data(), dup.data());
  ExpectGradMatchesFiniteDifferences(dgate, gate, loss, "dgate");
  ExpectGradMatchesFiniteDifferences(dup, up, loss, "dup");
  Vec g2 = gate, u2 = up;
  backward(g2.data(), u2.data(), weights.data(), n, g2.data(), u2.data());
  EXPECT_EQ(g2, dgate);
  EXPECT_EQ(u2, dup);
}

TEST(CpuGradCheck, SwiGluBackward) {
  CheckGluGradients(SwiGluForward<double>, SwiGluBackward<double, double>);
}

TEST(CpuGradCheck, GeluTanhGluBackward) {
  CheckGluGradients(GeluTanhGluForward<double>, GeluTanhGluBackward<double, double>);
}

TEST(CpuGradCheck, CrossEntropyGradientWithIgnoredTargets) {
  const int64_t rows = 6, V = 11;
  const std::vector<int32_t> targets = {3, -100, 0, 10, -100, 3};
  const double scale = 1.0 / 4;  // mean over the 4 counted rows
  Vec logits = Random<double>(rows * V, 31, -3, 3);
  auto loss = [&] {
    return scale * CrossEntropy(logits.data(), targets.data(), rows, V, 0.0, static_cast<double*>(nullptr));
  };
  Vec grad(rows * V, 123.0);
  CrossEntropy(logits.data(), targets.data(), rows, V, scale, grad.data());
  ExpectGradMatchesFiniteDifferences(grad, logits, loss, "dlogits");
  for (int64_t j = 0; j < V; ++j) {
    EXPECT_EQ(grad[1 * V + j], 0.0);
    EXPECT_EQ(grad[4 * V + j], 0.0);
  }
}

// Gemma 2's final_logit_softcapping: the loss of SoftCap(x), its gradient with respect to x (the
// raw logits) from CrossEntropy's softcap, in place over the capped logits as the model calls it.
TEST(CpuGradCheck, SoftCappedCrossEntropyGradientIsThroughTheCap) {
  const int64_t rows = 5, V = 9;
  const std::vector<int32_t> targets = {2, -100, 8, 0, 2};
  const double scale = 1.0 / 4, cap = 1.5;
  Vec logits = Random<double>(rows * V, 37, -4, 4);  // |x| up to 2.7 cap: tanh bends
  auto loss = [&] {
    Vec capped = logits;
    SoftCap(rows * V, cap, capped.data());
    return scale * CrossEntropy(capped.data(), targets.data(), rows, V, 0.0, static_cast<double*>(nullptr));
  };
  Vec grad = logits;
  SoftCap(rows * V, cap, grad.data());
  for (double y : grad) EXPECT_LT(std::fabs(y), cap);
  CrossEntropy(grad.data(), targets.data(), rows, V, scale, grad.data(), cap);
  ExpectGradMatchesFiniteDifferences(grad, logits, loss, "dlogits");
  for (int64_t j = 0; j < V; ++j) EXPECT_EQ(grad[1 * V + j], 0.0);
}

TEST(CpuGradCheck, EmbeddingBackwardAccumulatesRepeatedIds) {
  const int64_t vocab = 6, D = 5;
  const std::vector<int32_t> ids = {1, 3, 1, 0, 5, 3, 3};
  const int64_t rows = static_cast<int64_t>(ids.size());
  Vec table = Random<double>(vocab * D, 41);
  const Vec weights = Random<double>(rows * D, 42);
  auto loss = [&] {
    Vec out(rows * D);
    EmbeddingForward(table.data(), ids.data(), rows, D, out.data());
    return Dot(out, weights);
  };
  const Vec start = Random<double>(vocab * D, 43);  // dtable accumulates
  Vec dtable = start;
  EmbeddingBackward(weights.data(), ids.data(), rows, D, dtable.data());
  for (size_t i = 0; i < dtable.size(); ++i) dtable[i] -= start[i];
  ExpectGradMatchesFiniteDifferences(dtable, table, loss, "dtable");
}

// C = op(A) op(B) as a linear map: dop(A) = W op(B)ᵀ, dop(B) = op(A)ᵀ W,
// computed with Gemm itself in the stored layout of A and B.
class GemmGradCheck : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GemmGradCheck, GradientsAreGemmsOfTheUpstreamGradient) {
  const bool ta = std::get<0>(GetParam()), tb = std::get<1>(GetParam());  // plain names: lambdas capture them
  const int64_t M = 4, N = 5, K = 3;
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  Vec A = Random<double>(M * K, 51), B = Random<double>(K * N, 52);
  const Vec W = Random<double>(M * N, 53);
  auto loss = [&] {
    Vec C(M * N);
    Gemm(ta, tb, M, N, K, 1.0, A.data(), lda, B.data(), ldb, 0.0, C.data(), N);
    return Dot(C, W);
  };
  Vec dA(M * K), dB(K * N);
  if (!ta) {
    Gemm(false, !tb, M, K, N, 1.0, W.data(), N, B.data(), ldb, 0.0, dA.data(), K);  // W op(B)ᵀ
  } else {
    Gemm(tb, true, K, M, N, 1.0, B.data(), ldb, W.data(), N, 0.0, dA.data(), M);  // (W op(B)ᵀ)ᵀ
  }
  if (!tb) {
    Gemm(!ta, false, K, N, M, 1.0, A.data(), lda, W.data(), N, 0.0, dB.data(), N);  // op(A)ᵀ W
  } else {
    Gemm(true, ta, N, K, M, 1.0, W.data(), N, A.data(), lda, 0.0, dB.data(), K);  // (op(A)ᵀ W)ᵀ
  }
  ExpectGradMatchesFiniteDifferences(dA, A, loss, "dA");
  ExpectGradMatchesFiniteDifferences(dB, B, loss, "dB");
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmGradCheck,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

}  // namespace
}  // namespace ft::cpu
