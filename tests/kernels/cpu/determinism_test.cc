// Every op gives bit-identical results run after run and for any OpenMP
// thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/openmp_start.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/cpu/test_util.h"

#ifdef FT_HAVE_OPENMP
#include <omp.h>
#endif

namespace ft::cpu {
namespace {

using test_util::Random;

// Named outputs of one run of every op.
template <typename T>
struct Outputs {
  std::vector<std::string> names;
  std::vector<std::vector<T>> values;
  void Add(const std::string& name, std::vector<T> v) {
    names.push_back(name);
    values.push_back(std::move(v));
  }
};

template <typename T>
void RunDense(Outputs<T>& o) {
  // Several blocks of C in each direction (Gemm splits C into fixed blocks).
  const int64_t M = 600, N = 1100, K = 130, rows = 96, D = 600;
  const auto A = Random<T>(M * K, 1), B = Random<T>(K * N, 2);
  std::vector<T> C(M * N);
  Gemm<T>(false, true, M, N, K, T(1), A.data(), K, B.data(), K, T(0), C.data(), N);  // B read as [N, K]
  o.Add("gemm", C);

  const auto x = Random<T>(rows * D, 3), w = Random<T>(D, 4), dy = Random<T>(rows * D, 5);
  std::vector<T> y(rows * D), rstd(rows), dx(rows * D), dw(D, T(0));
  RmsNormForward(x.data(), w.data(), rows, D, T(1e-5), y.data(), rstd.data());
  RmsNormBackward(x.data(), w.data(), rstd.data(), dy.data(), rows, D, dx.data(), dw.data());
  o.Add("rmsnorm y", y);
  o.Add("rmsnorm dx", dx);
  o.Add("rmsnorm dw", dw);

  std::vector<T> h(rows * D), dgate(rows * D), dup(rows * D);
  SwiGluForward(x.data(), dy.data(), rows * D, h.data());
  SwiGluBackward<T>(x.data(), dy.data(), y.data(), rows * D, dgate.data(), dup.data());
  o.Add("swiglu", h);
  o.Add("swiglu dgate", dgate);

  std::vector<int32_t> ids(rows), targets(rows);
  for (int64_t r = 0; r < rows; ++r) {
    ids[r] = static_cast<int32_t>((r * 7) % 13);  // repeated ids
    targets[r] = r % 5 == 0 ? -100 : static_cast<int32_t>((r * 31) % D);
  }
  std::vector<T> dtable(13 * D, T(0));
  EmbeddingBackward(dy.data(), ids.data(), rows, D, dtable.data());
  o.Add("embedding backward", dtable);

  std::vector<T> dlogits(rows * D);
  const double loss = CrossEntropy(x.data(), targets.data(), rows, D, T(0.01), dlogits.data());
  o.Add("cross entropy dlogits", dlogits);
  o.Add("cross entropy loss, sum of squares",
        {static_cast<T>(loss), static_cast<T>(SumSquares(x.data(), rows * D))});

  auto param = x, m = dy, v = Random<T>(rows * D, 6, 0, 1);
  AdamWParams hp;
  hp.weight_decay = 0.01;
  hp.step = 3;
  AdamW(hp, rows * D, param.data(), dx.data(), m.data(), v.data());
  o.Add("adamw param", param);
}

template <typename T>
void RunAttention(Outputs<T>& o) {
  const int64_t batch = 2, seq = 100, hq = 4, hkv = 2, hd = 32, rows = batch * seq;
  const AttentionShape s{batch, seq, hq, hkv, hd, 1.0 / std::sqrt(32.0)};
  const auto q = Random<T>(rows * hq * hd, 7, -2, 2), k = Random<T>(rows * hkv * hd, 8, -2, 2);
  const auto v = Random<T>(rows * hkv * hd, 9), dout = Random<T>(rows * hq * hd, 10);
  std::vector<int32_t> seg(rows);
  for (int64_t i = 0; i < rows; ++i) seg[i] = static_cast<int32_t>(i / 37);
  std::vector<T> out(q.size()), lse(batch * hq * seq), dq(q.size()), dk(k.size()), dv(v.size());
  AttentionForward(s, q.data(), k.data(), v.data(), seg.data(), out.data(), lse.data());
  AttentionBackward(s, q.data(), k.data(), v.data(), seg.data(), out.data(), lse.data(), dout.data(),
                    dq.data(), dk.data(), dv.data());
  o.Add("attention out", out);
  o.Add("attention lse", lse);
  o.Add("attention dq", dq);
  o.Add("attention dk", dk);
  o.Add("attention dv", dv);
  std::vector<T> naive_out(q.size()), naive_lse(lse.size());
  AttentionForwardNaive(s, q.data(), k.data(), v.data(), seg.data(), naive_out.data(), naive_lse.data());
  o.Add("naive attention out", naive_out);

  // RoPE on q with positions restarting per segment.
  std::vector<int32_t> pos(rows);
  for (int64_t i = 0; i < rows; ++i) pos[i] = static_cast<int32_t>(i % 37);
  const auto cos_t = Random<T>(37 * hd / 2, 11), sin_t = Random<T>(37 * hd / 2, 12);
  auto rq = q;
  RopeApply(rq.data(), rows, hq, hd, pos.data(), cos_t.data(), sin_t.data(), false);
  o.Add("rope", rq);
}

template <typename T>
Outputs<T> RunAll() {
  Outputs<T> o;
  RunDense(o);
  RunAttention(o);
  return o;
}

template <typename T>
void ExpectBitIdentical(const Outputs<T>& a, const Outputs<T>& b, const std::string& what) {
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t i = 0; i < a.values.size(); ++i) {
    ASSERT_EQ(a.values[i].size(), b.values[i].size());
    EXPECT_EQ(0, std::memcmp(a.values[i].data(), b.values[i].data(), sizeof(T) * a.values[i].size()))
        << a.names[i] << " differs: " << what;
  }
}

template <typename T>
class CpuDeterminism : public ::testing::Test {};
using ScalarTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CpuDeterminism, ScalarTypes);

TYPED_TEST(CpuDeterminism, RepeatedRunsAreBitIdentical) {
  ExpectBitIdentical(RunAll<TypeParam>(), RunAll<TypeParam>(), "second run");
}

TYPED_TEST(CpuDeterminism, ThreadCountDoesNotChangeResults) {
#ifdef FT_HAVE_OPENMP
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = RunAll<TypeParam>();
  for (int threads : {2, 3}) {
    omp_set_num_threads(threads);
    ExpectBitIdentical(one, RunAll<TypeParam>(), std::to_string(threads) + " threads vs 1");
  }
  omp_set_num_threads(saved);
#else
  GTEST_SKIP() << "built without OpenMP: the kernels run on one thread";
#endif
}

}  // namespace
}  // namespace ft::cpu
