// kernels/cuda/ops.h's typed activations beside fp32 weights and gradients
// (<T, P = float>, T = bf16 or fp16): each op reads and writes T in place and
// must give, bit for bit, what the fp32 op (<float, float>) gives on the same
// values widened, with its T outputs rounded to nearest even afterwards (what
// the CUDA backend computed before, through fp32 staging copies; the CPU
// backend's definition). Equality, not a bound: one value computed in fp32
// either way, rounded once. Outputs are poisoned (NaN) first: an element
// neither path writes fails.
//
// Label gpu: skipped with the reason when no CUDA device is visible; with
// FT_REQUIRE_GPU=1 (bench/gpu/run.sh) that is a failure.
#include <cmath>
#include <cstring>
#include <string>

#include "tests/kernels/cuda/harness.h"

namespace ft::cuda::testing {
namespace {

template <typename T>
class TypedActivationsTest : public CudaOpTest {
 protected:
  // Values T holds, as floats.
  std::vector<float> Held(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    return RoundTo<T>(Random(n, lo, hi));
  }
  // The typed op's output (widened) equals the fp32 op's rounded to T, bit for bit.
  void ExpectTypedIsRounded(const std::string& what, const DeviceBuffer<T>& typed,
                            const DeviceBuffer<float>& f32) {
    ExpectSameBits(what, typed.DownloadFloat(), RoundTo<T>(f32.Download()));
  }
  void ExpectSameBits(const std::string& what, const std::vector<float>& got,
                      const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size()) << what;
    int64_t differ = 0, first = -1, unwritten = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0)
        first = static_cast<int64_t>(i);
      unwritten += std::isnan(got[i]);  // the poison (no output here is NaN)
    }
    EXPECT_EQ(unwritten, 0) << what << ": elements left unwritten (NaN)";
    EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << got.size() << " elements differ (first at "
                         << first << ": " << (first >= 0 ? got[first] : 0.0f) << " vs "
                         << (first >= 0 ? want[first] : 0.0f) << ")";
    if (differ == 0) std::printf("SAME BITS %s (%zu elements)\n", what.c_str(), got.size());
  }
};

using StorageTypes = ::testing::Types<bf16, fp16>;
TYPED_TEST_SUITE(TypedActivationsTest, StorageTypes);

TYPED_TEST(TypedActivationsTest, NormRopeSwiGluAxpyAndEmbeddingAreTheFp32OpsRounded) {
  using T = TypeParam;
  const int64_t rows = 37, D = 200, heads = 3, hd = 64, n = rows * D;
  const std::vector<float> x = this->Held(n, -2, 2), w = this->Random(D, 0.5f, 1.5f), dy = this->Random(n);
  const std::vector<float> dw0 = this->Random(D);
  DeviceBuffer<T> xt(Encode<T>(x)), yt(n);
  DeviceBuffer<float> xf(x), wf(w), dyf(dy), yf(n), rstd_t(rows), rstd_f(rows), dx_t(n), dx_f(n), dw_t(dw0),
      dw_f(dw0), ws(RmsNormBackwardWorkspaceFloats(rows, D));
  for (auto* out : {&yf, &rstd_t, &rstd_f, &dx_t, &dx_f}) out->Poison();
  yt.Poison();
  FT_ASSERT_OK(RmsNormForward(xt.get(), wf.get(), rows, D, 1e-5f, yt.get(), rstd_t.get(), this->stream_));
  FT_ASSERT_OK(RmsNormForward(xf.get(), wf.get(), rows, D, 1e-5f, yf.get(), rstd_f.get(), this->stream_));
  FT_ASSERT_OK(RmsNormBackward(xt.get(), wf.get(), rstd_t.get(), dyf.get(), rows, D, dx_t.get(), dw_t.get(),
                               ws.get(), this->stream_));
  FT_ASSERT_OK(RmsNormBackward(xf.get(), wf.get(), rstd_f.get(), dyf.get(), rows, D, dx_f.get(), dw_f.get(),
                               ws.get(), this->stream_));
  this->ExpectTypedIsRounded("rmsnorm y", yt, yf);
  this->ExpectSameBits("rmsnorm rstd", rstd_t.Download(), rstd_f.Download());
  this->ExpectSameBits("rmsnorm dx", dx_t.Download(), dx_f.Download());
  this->ExpectSameBits("rmsnorm dw", dw_t.Download(), dw_f.Download());

  const int64_t rn = rows * heads * hd;
  const std::vector<float> q = this->Held(rn), cs = this->Random(rows * hd / 2),
                           sn = this->Random(rows * hd / 2);
  std::vector<int32_t> pos(rows);
  for (int64_t i = 0; i < rows; ++i) pos[i] = static_cast<int32_t>(i);
  DeviceBuffer<T> qt(Encode<T>(q));  // RoPE rotates in place: every element is rewritten
  DeviceBuffer<float> qf(q), cosf(cs), sinf(sn);
  DeviceBuffer<int32_t> dpos(pos);
  FT_ASSERT_OK(
      RopeApply(qt.get(), rows, heads, hd, dpos.get(), cosf.get(), sinf.get(), false, this->stream_));
  FT_ASSERT_OK(
      RopeApply(qf.get(), rows, heads, hd, dpos.get(), cosf.get(), sinf.get(), false, this->stream_));
  this->ExpectTypedIsRounded("rope", qt, qf);

  const std::vector<float> g = this->Held(n, -4, 4), u = this->Held(n);
  DeviceBuffer<T> gt(Encode<T>(g)), ut(Encode<T>(u)), ht(n);
  DeviceBuffer<float> gf(g), uf(u), hf(n), dg_t(n), du_t(n), dg_f(n), du_f(n);
  for (auto* out : {&hf, &dg_t, &du_t, &dg_f, &du_f}) out->Poison();
  ht.Poison();
  FT_ASSERT_OK(SwiGluForward(gt.get(), ut.get(), n, ht.get(), this->stream_));
  FT_ASSERT_OK(SwiGluForward(gf.get(), uf.get(), n, hf.get(), this->stream_));
  FT_ASSERT_OK(SwiGluBackward(gt.get(), ut.get(), dyf.get(), n, dg_t.get(), du_t.get(), this->stream_));
  FT_ASSERT_OK(SwiGluBackward(gf.get(), uf.get(), dyf.get(), n, dg_f.get(), du_f.get(), this->stream_));
  this->ExpectTypedIsRounded("swiglu h", ht, hf);
  this->ExpectSameBits("swiglu dgate", dg_t.Download(), dg_f.Download());
  this->ExpectSameBits("swiglu dup", du_t.Download(), du_f.Download());

  DeviceBuffer<float> acc_t(dy), acc_f(dy);
  FT_ASSERT_OK(Axpy(n, 0.5f, xt.get(), acc_t.get(), this->stream_));
  FT_ASSERT_OK(Axpy(n, 0.5f, xf.get(), acc_f.get(), this->stream_));
  this->ExpectSameBits("axpy", acc_t.Download(), acc_f.Download());

  const int64_t vocab = 11;
  std::vector<int32_t> ids(rows);
  for (int64_t i = 0; i < rows; ++i) ids[i] = static_cast<int32_t>((i * 7) % vocab);
  DeviceBuffer<float> table(this->Random(vocab * D, -3, 3)), ef(n);
  DeviceBuffer<int32_t> dids(ids);
  DeviceBuffer<T> et(n);
  et.Poison();
  ef.Poison();
  FT_ASSERT_OK(EmbeddingForward(table.get(), dids.get(), rows, D, et.get(), this->stream_));
  FT_ASSERT_OK(EmbeddingForward(table.get(), dids.get(), rows, D, ef.get(), this->stream_));
  this->ExpectTypedIsRounded("embedding", et, ef);
}

// Attention as the CUDA backend runs it: bf16 storage on tensor cores (fp32
// storage with kBf16 math, the same operands), fp16 with fp32 math; q, k, v,
// out in T, dout and the gradients fp32.
TYPED_TEST(TypedActivationsTest, AttentionIsTheFp32AttentionRounded) {
  using T = TypeParam;
  const AttentionMath math = std::is_same_v<T, bf16> ? AttentionMath::kBf16 : AttentionMath::kFp32;
  for (const int64_t hd : {64, 128}) {
    const AttentionShape s{2, 70, 4, 2, hd, 1.0 / std::sqrt(static_cast<double>(hd))};
    const int64_t qn = s.batch * s.seq * s.q_heads * hd, kvn = s.batch * s.seq * s.kv_heads * hd;
    const std::vector<float> q = this->Held(qn), k = this->Held(kvn), v = this->Held(kvn),
                             dout = this->Random(qn);
    DeviceBuffer<T> qt(Encode<T>(q)), kt(Encode<T>(k)), vt(Encode<T>(v)), ot(qn);
    DeviceBuffer<float> qf(q), kf(k), vf(v), of(qn), lse_t(s.batch * s.q_heads * s.seq),
        lse_f(s.batch * s.q_heads * s.seq), doutf(dout), ws(AttentionBackwardWorkspaceFloats(s));
    for (auto* out : {&of, &lse_t, &lse_f}) out->Poison();
    ot.Poison();
    FT_ASSERT_OK(AttentionForward(s, qt.get(), kt.get(), vt.get(), nullptr, ot.get(), lse_t.get(),
                                  this->stream_, math));
    FT_ASSERT_OK(AttentionForward(s, qf.get(), kf.get(), vf.get(), nullptr, of.get(), lse_f.get(),
                                  this->stream_, math));
    const std::string at = " (head dim " + std::to_string(hd) + ")";
    this->ExpectTypedIsRounded("attention out" + at, ot, of);
    this->ExpectSameBits("attention lse" + at, lse_t.Download(), lse_f.Download());
    // The backward of both reads the same stored output: out in T, widened for the fp32 op.
    DeviceBuffer<float> of_held(ot.DownloadFloat());
    DeviceBuffer<float> dq_t(qn), dk_t(kvn), dv_t(kvn), dq_f(qn), dk_f(kvn), dv_f(kvn);
    for (auto* out : {&dq_t, &dk_t, &dv_t, &dq_f, &dk_f, &dv_f}) out->Poison();
    FT_ASSERT_OK(AttentionBackward(s, qt.get(), kt.get(), vt.get(), nullptr, ot.get(), lse_t.get(),
                                   doutf.get(), dq_t.get(), dk_t.get(), dv_t.get(), ws.get(), this->stream_,
                                   math));
    FT_ASSERT_OK(AttentionBackward(s, qf.get(), kf.get(), vf.get(), nullptr, of_held.get(), lse_t.get(),
                                   doutf.get(), dq_f.get(), dk_f.get(), dv_f.get(), ws.get(), this->stream_,
                                   math));
    this->ExpectSameBits("attention dq" + at, dq_t.Download(), dq_f.Download());
    this->ExpectSameBits("attention dk" + at, dk_t.Download(), dk_f.Download());
    this->ExpectSameBits("attention dv" + at, dv_t.Download(), dv_f.Download());
  }
}

}  // namespace
}  // namespace ft::cuda::testing
