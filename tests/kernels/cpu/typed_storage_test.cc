// Typed storage (kernels/cpu/dtype.h, ops.h): every op that reads or writes
// activations in bf16 or half must give, bit for bit, what the float op gives
// on the widened inputs followed by rounding its stored outputs — the bf16
// emulation the engine ran before, and what the goldens were checked with.
// The float path itself is unchanged (the other kernel tests). The same holds
// for a gradient stored in S (a backward's dy or dh): read exactly, the
// float op's result, and stored rounded when the op writes gradients in S.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"

namespace ft::cpu {
namespace {

// Random values already representable in S (so widening them is exact).
template <typename S>
std::vector<S> RandomStored(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<S> out(static_cast<size_t>(n));
  for (S& x : out) Store(dist(rng), &x);
  return out;
}
template <typename S>
std::vector<float> Widened(const std::vector<S>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = Load(x[i]);
  return out;
}
// The float values rounded as S stores them, back as float.
template <typename S>
std::vector<float> RoundedAs(std::vector<float> x) {
  for (float& v : x) {
    S s;
    Store(v, &s);
    v = Load(s);
  }
  return x;
}
template <typename S>
void ExpectSameBits(const std::vector<S>& typed, const std::vector<float>& reference, const char* what) {
  ASSERT_EQ(typed.size(), reference.size()) << what;
  const std::vector<float> rounded = RoundedAs<S>(reference);
  int64_t differing = 0;
  for (size_t i = 0; i < typed.size(); ++i) {
    const float got = Load(typed[i]);
    differing += std::memcmp(&got, &rounded[i], sizeof(float)) != 0 ? 1 : 0;
  }
  EXPECT_EQ(differing, 0) << what << ": elements differing from the rounded float op";
}
void ExpectSameFloats(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

template <typename S>
class TypedStorageTest : public ::testing::Test {};
using StorageTypes = ::testing::Types<Bf16, Half>;
TYPED_TEST_SUITE(TypedStorageTest, StorageTypes);

TYPED_TEST(TypedStorageTest, RmsNormForwardAndBackward) {
  using S = TypeParam;
  const int64_t rows = 7, D = 96;
  const std::vector<S> x = RandomStored<S>(rows * D, 1);
  const std::vector<S> dy_stored = RandomStored<S>(rows * D, 3);
  const std::vector<float> xf = Widened(x), w = Widened(RandomStored<S>(D, 2)), dy = Widened(dy_stored);
  std::vector<S> y(rows * D);
  std::vector<float> yf(rows * D), rstd(rows), rstd_f(rows);
  RmsNormForward<float, S>(x.data(), w.data(), rows, D, 1e-5f, y.data(), rstd.data());
  RmsNormForward<float>(xf.data(), w.data(), rows, D, 1e-5f, yf.data(), rstd_f.data());
  ExpectSameBits(y, yf, "rmsnorm y");
  ExpectSameFloats(rstd, rstd_f, "rmsnorm rstd (fp32 either way)");
  std::vector<float> dx(rows * D), dx_f(rows * D), dw(D, 0.5f), dw_f(D, 0.5f);
  RmsNormBackward<float, S>(x.data(), w.data(), rstd.data(), dy.data(), rows, D, dx.data(), dw.data());
  RmsNormBackward<float>(xf.data(), w.data(), rstd.data(), dy.data(), rows, D, dx_f.data(), dw_f.data());
  ExpectSameFloats(dx, dx_f, "rmsnorm dx");
  ExpectSameFloats(dw, dw_f, "rmsnorm dw");
  std::vector<float> dx_g(rows * D), dw_g(D, 0.5f);  // dy stored in S: the same values, read exactly
  RmsNormBackward<float, S, S>(x.data(), w.data(), rstd.data(), dy_stored.data(), rows, D, dx_g.data(),
                               dw_g.data());
  ExpectSameFloats(dx_g, dx_f, "rmsnorm dx from a stored dy");
  ExpectSameFloats(dw_g, dw_f, "rmsnorm dw from a stored dy");
}

TYPED_TEST(TypedStorageTest, RopeInPlace) {
  using S = TypeParam;
  const int64_t rows = 5, heads = 3, hd = 16, max_pos = 9;
  std::vector<S> x = RandomStored<S>(rows * heads * hd, 4);
  std::vector<float> xf = Widened(x);
  const std::vector<float> cos_t = Widened(RandomStored<float>(max_pos * hd / 2, 5)),
                           sin_t = Widened(RandomStored<float>(max_pos * hd / 2, 6));
  const std::vector<int32_t> pos = {0, 3, 8, 2, 5};
  RopeApply<float, S>(x.data(), rows, heads, hd, pos.data(), cos_t.data(), sin_t.data(), false);
  RopeApply<float>(xf.data(), rows, heads, hd, pos.data(), cos_t.data(), sin_t.data(), false);
  ExpectSameBits(x, xf, "rope");
}

TYPED_TEST(TypedStorageTest, AttentionForwardNaiveAndBackward) {
  using S = TypeParam;
  AttentionShape s{2, 24, 4, 2, 16, 0.25};
  const int64_t q_n = s.batch * s.seq * s.q_heads * s.head_dim,
                kv_n = s.batch * s.seq * s.kv_heads * s.head_dim;
  const std::vector<S> q = RandomStored<S>(q_n, 7), k = RandomStored<S>(kv_n, 8),
                       v = RandomStored<S>(kv_n, 9);
  const std::vector<float> qf = Widened(q), kf = Widened(k), vf = Widened(v);
  std::vector<int32_t> seg(s.batch * s.seq);
  for (size_t i = 0; i < seg.size(); ++i) seg[i] = static_cast<int32_t>((i % s.seq) / 10);  // packed
  for (bool naive : {false, true}) {
    std::vector<S> out(q_n);
    std::vector<float> out_f(q_n), lse(s.batch * s.q_heads * s.seq), lse_f(lse.size());
    if (naive) {
      AttentionForwardNaive<float, S>(s, q.data(), k.data(), v.data(), seg.data(), out.data(), lse.data());
      AttentionForwardNaive<float>(s, qf.data(), kf.data(), vf.data(), seg.data(), out_f.data(),
                                   lse_f.data());
    } else {
      AttentionForward<float, S>(s, q.data(), k.data(), v.data(), seg.data(), out.data(), lse.data());
      AttentionForward<float>(s, qf.data(), kf.data(), vf.data(), seg.data(), out_f.data(), lse_f.data());
    }
    ExpectSameBits(out, out_f, naive ? "naive attention out" : "flash attention out");
    ExpectSameFloats(lse, lse_f, "attention lse");
    if (naive) continue;
    const std::vector<float> dout = Widened(RandomStored<S>(q_n, 10)), out_w = Widened(out);
    std::vector<float> dq(q_n), dk(kv_n), dv(kv_n), dq_f(q_n), dk_f(kv_n), dv_f(kv_n);
    AttentionBackward<float, S>(s, q.data(), k.data(), v.data(), seg.data(), out.data(), lse.data(),
                                dout.data(), dq.data(), dk.data(), dv.data());
    AttentionBackward<float>(s, qf.data(), kf.data(), vf.data(), seg.data(), out_w.data(), lse.data(),
                             dout.data(), dq_f.data(), dk_f.data(), dv_f.data());
    ExpectSameFloats(dq, dq_f, "attention dq");
    ExpectSameFloats(dk, dk_f, "attention dk");
    ExpectSameFloats(dv, dv_f, "attention dv");
  }
}

TYPED_TEST(TypedStorageTest, SwiGluEmbeddingAxpyAndConvert) {
  using S = TypeParam;
  const int64_t n = 1000;
  const std::vector<S> g = RandomStored<S>(n, 11, 3.0f), u = RandomStored<S>(n, 12);
  const std::vector<S> dh_stored = RandomStored<S>(n, 13);
  const std::vector<float> gf = Widened(g), uf = Widened(u), dh = Widened(dh_stored);
  std::vector<S> h(n);
  std::vector<float> hf(n);
  SwiGluForward<S>(g.data(), u.data(), n, h.data());
  SwiGluForward<float>(gf.data(), uf.data(), n, hf.data());
  ExpectSameBits(h, hf, "swiglu h");
  std::vector<float> dg(n), du(n), dg_f(n), du_f(n);
  SwiGluBackward<float, S>(g.data(), u.data(), dh.data(), n, dg.data(), du.data());
  SwiGluBackward<float>(gf.data(), uf.data(), dh.data(), n, dg_f.data(), du_f.data());
  ExpectSameFloats(dg, dg_f, "swiglu dgate");
  ExpectSameFloats(du, du_f, "swiglu dup");
  std::vector<S> dg_s(n), du_s(n), dg_gelu(n), du_gelu(n);  // gradients stored in S: rounded
  SwiGluBackward<float, S, S>(g.data(), u.data(), dh_stored.data(), n, dg_s.data(), du_s.data());
  ExpectSameBits(dg_s, dg_f, "swiglu dgate stored");
  ExpectSameBits(du_s, du_f, "swiglu dup stored");
  GeluTanhGluBackward<float, S, S>(g.data(), u.data(), dh_stored.data(), n, dg_gelu.data(), du_gelu.data());
  GeluTanhGluBackward<float>(gf.data(), uf.data(), dh.data(), n, dg_f.data(), du_f.data());
  ExpectSameBits(dg_gelu, dg_f, "gelu-tanh glu dgate stored");
  ExpectSameBits(du_gelu, du_f, "gelu-tanh glu dup stored");

  const int64_t vocab = 11, D = 40, rows = 6;
  const std::vector<float> table = Widened(RandomStored<float>(vocab * D, 14));  // full float precision
  const std::vector<int32_t> ids = {3, 0, 10, 3, 7, 1};
  std::vector<S> e(rows * D);
  std::vector<float> ef(rows * D);
  EmbeddingForward<float, S>(table.data(), ids.data(), rows, D, e.data());
  EmbeddingForward<float>(table.data(), ids.data(), rows, D, ef.data());
  ExpectSameBits(e, ef, "embedding");

  std::vector<float> y = Widened(RandomStored<float>(n, 15)), y_f = y;
  Axpy<float, S>(n, 0.75f, g.data(), y.data());
  Axpy<float>(n, 0.75f, gf.data(), y_f.data());
  ExpectSameFloats(y, y_f, "axpy");

  std::vector<S> narrowed(n);
  std::vector<float> widened(n);
  Convert(y.data(), n, narrowed.data());
  ExpectSameBits(narrowed, y, "convert narrow");
  Convert(narrowed.data(), n, widened.data());
  ExpectSameFloats(widened, Widened(narrowed), "convert widen");
}

}  // namespace
}  // namespace ft::cpu
