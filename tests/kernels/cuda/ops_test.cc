// Every CUDA op but attention against the CPU reference (harness.h), on odd
// shapes, fp32 and bf16 (fp16 where the op takes it).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "kernels/cpu/nf4.h"
#include "tests/kernels/cuda/harness.h"

namespace ft::cuda::testing {
namespace {

class CudaOpsTest : public CudaOpTest {
 protected:
  // ---- GEMM: C = alpha op(A) op(B) + beta C against cpu::Gemm<double>.
  template <typename TIn, typename TOut>
  void CheckGemm(BlasLt& blas, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad, float beta) {
    const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const std::vector<float> a = RoundTo<TIn>(Random((ta ? K : M) * lda));
    const std::vector<float> b = RoundTo<TIn>(Random((tb ? N : K) * ldb));
    const std::vector<float> c0 = RoundTo<TOut>(Random(M * ldc));
    DeviceBuffer<TIn> da(Encode<TIn>(a)), db(Encode<TIn>(b));
    DeviceBuffer<TOut> dc(Encode<TOut>(c0));
    if (beta == 0.0f) dc.Poison();  // C is not read when beta = 0
    const float alpha = 0.75f;
    FT_ASSERT_OK((blas.Gemm<TIn, TOut>(stream_, ta, tb, M, N, K, alpha, da.get(), lda, db.get(), ldb, beta,
                                       dc.get(), ldc)));
    std::vector<double> ref = ToDouble(c0);
    cpu::Gemm<double>(ta, tb, M, N, K, alpha, ToDouble(a).data(), lda, ToDouble(b).data(), ldb, beta,
                      ref.data(), ldc);
    std::vector<float> out = dc.DownloadFloat();
    // Padding columns are never written: compare them to the initial values only when C was read.
    std::vector<float> got;
    std::vector<double> want;
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        got.push_back(out[i * ldc + j]);
        want.push_back(ref[i * ldc + j]);
      }
    }
    EXPECT_TRUE(Close("gemm " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                          (ta ? " Ta" : "") + (tb ? " Tb" : ""),
                      got, want,
                      std::is_same_v<TIn, float> && std::is_same_v<TOut, float> ? kF32Bound : kHalfBound));
  }

  // ---- RMSNorm forward and backward (dw accumulates onto random values).
  template <typename T>
  void CheckRmsNorm(int64_t rows, int64_t D) {
    const float eps = 1e-5f;
    const std::vector<float> x = RoundTo<T>(Random(rows * D, -2, 2)), w = RoundTo<T>(Random(D, 0.5f, 1.5f));
    const std::vector<float> dy = RoundTo<T>(Random(rows * D)), dw0 = Random(D);
    DeviceBuffer<T> dx_in(Encode<T>(x)), dw_in(Encode<T>(w)), ddy(Encode<T>(dy)), dyv(rows * D),
        ddx(rows * D);
    DeviceBuffer<float> drstd(rows), ddw(dw0), ws(RmsNormBackwardWorkspaceFloats(rows, D));
    dyv.Poison();
    drstd.Poison();
    ddx.Poison();
    ws.Poison();
    FT_ASSERT_OK(RmsNormForward<T>(dx_in.get(), dw_in.get(), rows, D, eps, dyv.get(), drstd.get(), stream_));
    FT_ASSERT_OK(RmsNormBackward<T>(dx_in.get(), dw_in.get(), drstd.get(), ddy.get(), rows, D, ddx.get(),
                                    ddw.get(), ws.get(), stream_));
    std::vector<double> y(rows * D), rstd(rows), dx(rows * D), dw = ToDouble(dw0);
    const std::vector<double> xd = ToDouble(x), wd = ToDouble(w), dyd = ToDouble(dy);
    cpu::RmsNormForward<double>(xd.data(), wd.data(), rows, D, eps, y.data(), rstd.data());
    cpu::RmsNormBackward<double>(xd.data(), wd.data(), rstd.data(), dyd.data(), rows, D, dx.data(),
                                 dw.data());
    EXPECT_TRUE(Close("rmsnorm y", dyv.DownloadFloat(), y, Bound<T>()));
    EXPECT_TRUE(Close("rmsnorm rstd", drstd.Download(), rstd, kF32Bound));
    EXPECT_TRUE(Close("rmsnorm dx", ddx.DownloadFloat(), dx, Bound<T>()));
    EXPECT_TRUE(Close("rmsnorm dw", ddw.Download(), dw, Bound<T>()));
  }

  template <typename T>
  void CheckRope(int64_t rows, int64_t heads, int64_t hd, bool inverse, int64_t rotary = 0) {
    const int64_t max_pos = 300, half = (rotary > 0 ? rotary : hd) / 2;
    std::vector<float> cos_t(max_pos * half), sin_t(max_pos * half);
    for (int64_t p = 0; p < max_pos; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        const double theta = p * std::pow(10000.0, -1.0 * static_cast<double>(i) / static_cast<double>(half));
        cos_t[p * half + i] = static_cast<float>(std::cos(theta));
        sin_t[p * half + i] = static_cast<float>(std::sin(theta));
      }
    }
    cos_t = RoundTo<T>(cos_t);
    sin_t = RoundTo<T>(sin_t);
    std::vector<int32_t> pos(rows);
    for (auto& p : pos) p = RandomInt(0, max_pos - 1);
    const std::vector<float> x = RoundTo<T>(Random(rows * heads * hd));
    DeviceBuffer<T> dx(Encode<T>(x)), dcos(Encode<T>(cos_t)), dsin(Encode<T>(sin_t));
    DeviceBuffer<int32_t> dpos(pos);
    FT_ASSERT_OK(RopeApply<T>(dx.get(), rows, heads, hd, dpos.get(), dcos.get(), dsin.get(), inverse, stream_,
                              rotary));
    std::vector<double> ref = ToDouble(x);
    cpu::RopeApply<double>(ref.data(), rows, heads, hd, pos.data(), ToDouble(cos_t).data(),
                           ToDouble(sin_t).data(), inverse, rotary);
    EXPECT_TRUE(Close(inverse ? "rope inverse" : "rope", dx.DownloadFloat(), ref, Bound<T>()));
  }

  template <typename T>
  void CheckSwiGlu(int64_t n, bool in_place) {
    const std::vector<float> g = RoundTo<T>(Random(n, -6, 6)), u = RoundTo<T>(Random(n)),
                             dh = RoundTo<T>(Random(n));
    DeviceBuffer<T> dg(Encode<T>(g)), du(Encode<T>(u)), ddh(Encode<T>(dh)), dhout(n), ddg(n), ddu(n);
    dhout.Poison();
    ddg.Poison();
    ddu.Poison();
    FT_ASSERT_OK(SwiGluForward<T>(dg.get(), du.get(), n, dhout.get(), stream_));
    std::vector<double> h(n), rdg(n), rdu(n);
    cpu::SwiGluForward<double>(ToDouble(g).data(), ToDouble(u).data(), n, h.data());
    cpu::SwiGluBackward<double>(ToDouble(g).data(), ToDouble(u).data(), ToDouble(dh).data(), n, rdg.data(),
                                rdu.data());
    EXPECT_TRUE(Close("swiglu h", dhout.DownloadFloat(), h, Bound<T>()));
    if (in_place) {
      FT_ASSERT_OK(SwiGluBackward<T>(dg.get(), du.get(), ddh.get(), n, dg.get(), du.get(), stream_));
      EXPECT_TRUE(Close("swiglu dgate (in place)", dg.DownloadFloat(), rdg, Bound<T>()));
      EXPECT_TRUE(Close("swiglu dup (in place)", du.DownloadFloat(), rdu, Bound<T>()));
    } else {
      FT_ASSERT_OK(SwiGluBackward<T>(dg.get(), du.get(), ddh.get(), n, ddg.get(), ddu.get(), stream_));
      EXPECT_TRUE(Close("swiglu dgate", ddg.DownloadFloat(), rdg, Bound<T>()));
      EXPECT_TRUE(Close("swiglu dup", ddu.DownloadFloat(), rdu, Bound<T>()));
    }
  }

  template <typename T>
  void CheckEmbedding(int64_t vocab, int64_t rows, int64_t D) {
    const std::vector<float> table = RoundTo<T>(Random(vocab * D)), dout = RoundTo<T>(Random(rows * D));
    const std::vector<float> dtable0 = Random(vocab * D);
    std::vector<int32_t> ids(rows);
    for (auto& id : ids) id = RandomInt(0, static_cast<int>(vocab) - 1);  // repeats are likely
    DeviceBuffer<T> dtable(Encode<T>(table)), ddout(Encode<T>(dout)), dout_fwd(rows * D);
    DeviceBuffer<int32_t> dids(ids);
    DeviceBuffer<float> dgrad(dtable0);
    dout_fwd.Poison();
    FT_ASSERT_OK(EmbeddingForward<T>(dtable.get(), dids.get(), rows, D, dout_fwd.get(), stream_));
    FT_ASSERT_OK(EmbeddingBackward<T>(ddout.get(), dids.get(), rows, D, dgrad.get(), stream_));
    std::vector<double> out(rows * D), grad = ToDouble(dtable0);
    cpu::EmbeddingForward<double>(ToDouble(table).data(), ids.data(), rows, D, out.data());
    cpu::EmbeddingBackward<double>(ToDouble(dout).data(), ids.data(), rows, D, grad.data());
    EXPECT_TRUE(Close("embedding out", dout_fwd.DownloadFloat(), out, 0.0));  // a copy: exact
    EXPECT_TRUE(Close("embedding dtable", dgrad.Download(), grad, kF32Bound));
  }

  // Two chunks of rows accumulate into one loss sum; chunk 2 runs in place.
  template <typename T>
  void CheckCrossEntropy(int64_t rows, int64_t V) {
    const std::vector<float> logits = RoundTo<T>(Random(rows * V, -8, 8));
    std::vector<int32_t> targets(rows);
    for (auto& t : targets) t = RandomInt(0, 5) == 0 ? -100 : RandomInt(0, static_cast<int>(V) - 1);
    const float scale = 1.0f / 29.0f;
    DeviceBuffer<T> dlogits(Encode<T>(logits)), dgrad(rows * V);
    DeviceBuffer<int32_t> dtargets(targets);
    DeviceBuffer<float> drow(rows);
    DeviceBuffer<double> dsum(std::vector<double>{0.0});
    dgrad.Poison();
    drow.Poison();
    const int64_t first = rows / 2;
    FT_ASSERT_OK(CrossEntropy<T>(dlogits.get(), dtargets.get(), first, V, scale, dgrad.get(), drow.get(),
                                 dsum.get(), stream_));
    FT_ASSERT_OK(CrossEntropy<T>(dlogits.get() + first * V, dtargets.get() + first, rows - first, V, scale,
                                 dlogits.get() + first * V, drow.get() + first, dsum.get(), stream_));
    std::vector<double> ref_grad(rows * V);
    const double ref_loss =
        cpu::CrossEntropy<double>(ToDouble(logits).data(), targets.data(), rows, V, scale, ref_grad.data());
    std::vector<float> grad = dgrad.DownloadFloat();
    const std::vector<float> in_place = dlogits.DownloadFloat();
    std::copy(in_place.begin() + first * V, in_place.end(), grad.begin() + first * V);
    EXPECT_TRUE(Close("cross-entropy dlogits", grad, ref_grad, Bound<T>()));
    EXPECT_TRUE(Close("cross-entropy loss sum", {static_cast<float>(dsum.Download()[0])},
                      std::vector<double>{ref_loss}, kF32Bound));
    double row_sum = 0;
    for (float l : drow.Download()) row_sum += l;
    EXPECT_NEAR(row_sum, ref_loss, 1e-5 * std::fabs(ref_loss));
  }
};

TEST_F(CudaOpsTest, GemmFp32MatchesCpuInEveryTransposeOnOddShapes) {
  auto blas = BlasLt::Create();
  ASSERT_TRUE(blas.ok()) << blas.status().ToString();
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CheckGemm<float, float>(**blas, ta, tb, 37, 53, 29, 0, 0.0f);
      CheckGemm<float, float>(**blas, ta, tb, 1, 67, 300, 3, 0.5f);
      CheckGemm<float, float>(**blas, ta, tb, 130, 96, 256, 0, 0.0f);
    }
  }
}

TEST_F(CudaOpsTest, GemmBf16AndFp16AccumulateInFp32) {
  auto blas = BlasLt::Create();
  ASSERT_TRUE(blas.ok()) << blas.status().ToString();
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      CheckGemm<bf16, bf16>(**blas, ta, tb, 64, 96, 136, 0, 0.0f);
      CheckGemm<bf16, float>(**blas, ta, tb, 33, 17, 45, 0, 1.0f);
      CheckGemm<fp16, fp16>(**blas, ta, tb, 64, 40, 72, 8, 0.0f);
      CheckGemm<fp16, float>(**blas, ta, tb, 7, 129, 64, 0, 0.25f);
    }
  }
}

TEST_F(CudaOpsTest, GemmRejectsEmptyShapes) {
  auto blas = BlasLt::Create();
  ASSERT_TRUE(blas.ok()) << blas.status().ToString();
  DeviceBuffer<float> a(16);
  const Status st = (*blas)->Gemm<float, float>(stream_, false, false, 0, 4, 4, 1.0f, a.get(), 4, a.get(), 4,
                                                0.0f, a.get(), 4);
  EXPECT_TRUE(st.IsInvalidArgument()) << st.ToString();
}

// NF4 dequantization is bit-exact with the CPU (hence with bitsandbytes).
TEST_F(CudaOpsTest, Nf4DequantizeIsBitExactWithCpu) {
  for (bool dq : {false, true}) {
    for (int64_t n : {int64_t{64} * 300 + 37, int64_t{64} * 256 * 2, int64_t{7}}) {
      std::vector<float> x = Random(n, -0.2f, 0.2f);
      x[RandomInt(0, static_cast<int>(n) - 1)] = 3.0f;  // an outlier, as real weights have
      cpu::Nf4Config config;
      config.double_quant = dq;
      const cpu::Nf4Tensor q = cpu::QuantizeNf4(x.data(), n, config);
      std::vector<float> ref(n);
      cpu::DequantizeNf4(q, ref.data());
      DeviceBuffer<uint8_t> packed(q.packed), absmax_q(dq ? q.absmax_q : std::vector<uint8_t>{0});
      DeviceBuffer<float> absmax(dq ? std::vector<float>{0} : q.absmax),
          absmax2(dq ? q.absmax2 : std::vector<float>{0});
      Nf4DeviceTensor dq_tensor{n,       config, packed.get(), absmax.get(), absmax_q.get(), absmax2.get(),
                                q.offset};
      DeviceBuffer<float> out(n);
      DeviceBuffer<bf16> out_bf16(n);
      DeviceBuffer<fp16> out_fp16(n);
      out.Poison();
      out_bf16.Poison();
      out_fp16.Poison();
      FT_ASSERT_OK(DequantizeNf4<float>(dq_tensor, out.get(), stream_));
      FT_ASSERT_OK(DequantizeNf4<bf16>(dq_tensor, out_bf16.get(), stream_));
      FT_ASSERT_OK(DequantizeNf4<fp16>(dq_tensor, out_fp16.get(), stream_));
      const std::vector<float> got = out.Download();
      const std::vector<bf16> got_bf16 = out_bf16.Download();
      const std::vector<fp16> got_fp16 = out_fp16.Download();
      int64_t mismatches = 0, mismatches_bf16 = 0, mismatches_fp16 = 0;
      for (int64_t i = 0; i < n; ++i) {
        mismatches += std::memcmp(&got[i], &ref[i], sizeof(float)) != 0;
        const bf16 want = FromFloat<bf16>(ref[i]);
        mismatches_bf16 += std::memcmp(&got_bf16[i], &want, sizeof(bf16)) != 0;
        const fp16 want16 = FromFloat<fp16>(ref[i]);
        mismatches_fp16 += std::memcmp(&got_fp16[i], &want16, sizeof(fp16)) != 0;
      }
      EXPECT_EQ(mismatches, 0) << "n=" << n << " double_quant=" << dq;
      EXPECT_EQ(mismatches_bf16, 0) << "bf16, n=" << n << " double_quant=" << dq;
      EXPECT_EQ(mismatches_fp16, 0) << "fp16, n=" << n << " double_quant=" << dq;
      if (mismatches == 0) std::printf("TENSOR OK nf4 n=%ld dq=%d bit-exact\n", static_cast<long>(n), dq);
    }
  }
}

TEST_F(CudaOpsTest, RmsNormForwardBackwardMatchCpu) {
  CheckRmsNorm<float>(7, 1003);
  CheckRmsNorm<float>(130, 4096);
  CheckRmsNorm<bf16>(7, 1003);
  CheckRmsNorm<bf16>(65, 2048);
}

TEST_F(CudaOpsTest, RopeAndItsInverseMatchCpu) {
  for (bool inverse : {false, true}) {
    CheckRope<float>(13, 3, 64, inverse);
    CheckRope<float>(5, 2, 6, inverse);
    CheckRope<bf16>(13, 4, 128, inverse);
    CheckRope<float>(13, 3, 64, inverse, 48);  // partial rotary (Phi-4-mini: 0.75)
    CheckRope<bf16>(13, 4, 128, inverse, 96);
  }
}

TEST_F(CudaOpsTest, SwiGluForwardBackwardMatchCpu) {
  CheckSwiGlu<float>(10007, false);
  CheckSwiGlu<float>(999, true);
  CheckSwiGlu<bf16>(10007, false);
  CheckSwiGlu<bf16>(999, true);
}

TEST_F(CudaOpsTest, EmbeddingForwardBackwardMatchCpu) {
  CheckEmbedding<float>(50, 123, 77);
  CheckEmbedding<bf16>(13, 200, 256);
}

TEST_F(CudaOpsTest, ChunkedCrossEntropyMatchesCpu) {
  CheckCrossEntropy<float>(37, 5003);
  CheckCrossEntropy<float>(4, 151936);
  CheckCrossEntropy<bf16>(37, 5003);
}

TEST_F(CudaOpsTest, CrossEntropyBadTargetIsLoudNaN) {
  const int64_t V = 10;
  DeviceBuffer<float> logits(Random(V)), row(1);
  DeviceBuffer<int32_t> target(std::vector<int32_t>{static_cast<int32_t>(V)});
  FT_ASSERT_OK(
      CrossEntropy<float>(logits.get(), target.get(), 1, V, 1.0f, nullptr, row.get(), nullptr, stream_));
  EXPECT_TRUE(std::isnan(row.Download()[0]));
}

TEST_F(CudaOpsTest, AdamWMatchesCpuAndWritesTheComputeCopy) {
  const int64_t n = 10007;
  const std::vector<float> p0 = Random(n), g = Random(n, -0.1f, 0.1f), m0 = Random(n, -0.01f, 0.01f);
  const std::vector<float> v0 = Random(n, 0.0f, 1e-4f);
  const cpu::AdamWParams hp{2e-3, 0.9, 0.999, 1e-8, 0.01, 3};
  const float multiplier = 0.5f;
  DeviceBuffer<float> dp(p0), dg(g), dm(m0), dv(v0), dmult(std::vector<float>{multiplier});
  DeviceBuffer<bf16> dcopy(n);
  dcopy.Poison();
  FT_ASSERT_OK(
      AdamW<bf16>(hp, n, dp.get(), dg.get(), dm.get(), dv.get(), dcopy.get(), dmult.get(), nullptr, stream_));
  // The CPU engine scales the float gradient buffer, then steps.
  std::vector<float> p = p0, gs = g, m = m0, v = v0;
  cpu::Scale<float>(n, multiplier, gs.data());
  cpu::AdamW<float>(hp, n, p.data(), gs.data(), m.data(), v.data());
  const std::vector<float> got_p = dp.Download();
  EXPECT_TRUE(Close("adamw param", got_p, p, kF32Bound));
  EXPECT_TRUE(Close("adamw m", dm.Download(), m, kF32Bound));
  EXPECT_TRUE(Close("adamw v", dv.Download(), v, kF32Bound));
  const std::vector<bf16> copy = dcopy.Download();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bf16 want = FromFloat<bf16>(got_p[i]);
    mismatches += std::memcmp(&copy[i], &want, sizeof(bf16)) != 0;
  }
  EXPECT_EQ(mismatches, 0) << "the bf16 copy is the updated fp32 param rounded to nearest even";

  // A skipped step (fp16 overflow) writes nothing.
  DeviceBuffer<int> skip(std::vector<int>{1});
  FT_ASSERT_OK(
      AdamW<bf16>(hp, n, dp.get(), dg.get(), dm.get(), dv.get(), dcopy.get(), nullptr, skip.get(), stream_));
  EXPECT_EQ(dp.Download(), got_p);
}

TEST_F(CudaOpsTest, SumSquaresIsDeterministicAndMatchesCpu) {
  for (int64_t n : {int64_t{1}, int64_t{1000003}}) {
    const std::vector<float> x = Random(n);
    DeviceBuffer<float> dx(x);
    DeviceBuffer<double> ws(SumSquaresWorkspaceDoubles()), out(1);
    ws.Poison();
    out.Poison();
    FT_ASSERT_OK(SumSquares<float>(dx.get(), n, ws.get(), out.get(), false, stream_));
    const double first = out.Download()[0];
    FT_ASSERT_OK(SumSquares<float>(dx.get(), n, ws.get(), out.get(), false, stream_));
    const double second = out.Download()[0];
    EXPECT_EQ(std::memcmp(&first, &second, sizeof(double)), 0)
        << "two runs differ: " << first << " vs " << second;
    const double ref = cpu::SumSquares<float>(x.data(), n);
    EXPECT_NEAR(first, ref, 1e-12 * ref);
    FT_ASSERT_OK(SumSquares<float>(dx.get(), n, ws.get(), out.get(), true, stream_));
    EXPECT_NEAR(out.Download()[0], 2 * ref, 1e-12 * ref);
  }
}

// The multi-tensor form (one pass over the optimizer's gradients): each total is the per-tensor
// kernel's bit for bit, and the totals added in order give its chained sum, over tensors of every
// size from empty to larger than the grid (1000003 values), bf16 too.
TEST_F(CudaOpsTest, SumSquaresListGivesEachTensorsSumBitForBit) {
  const std::vector<int64_t> sizes = {7, 0, 1000003, 1, 131072, 4096, 65, 512 * 256 + 3};
  std::vector<std::unique_ptr<DeviceBuffer<float>>> tensors;
  std::vector<TensorSpan<float>> spans;
  for (size_t i = 0; i < sizes.size(); ++i) {
    tensors.push_back(std::make_unique<DeviceBuffer<float>>(Random(sizes[i])));
    spans.push_back({tensors.back()->get(), sizes[i]});
  }
  const auto count = static_cast<int64_t>(spans.size());
  std::vector<uint8_t> span_bytes(spans.size() * sizeof(spans[0]));
  std::memcpy(span_bytes.data(), spans.data(), span_bytes.size());
  DeviceBuffer<uint8_t> list(span_bytes);
  DeviceBuffer<double> ws(SumSquaresListWorkspaceDoubles(count)), totals(count);
  ws.Poison();
  totals.Poison();
  FT_ASSERT_OK(SumSquaresList<float>(reinterpret_cast<const TensorSpan<float>*>(list.get()), count, ws.get(),
                                     totals.get(), stream_));
  const std::vector<double> got = totals.Download();
  DeviceBuffer<double> one_ws(SumSquaresWorkspaceDoubles()), one(1), chained(1);
  double added = 0;
  for (int64_t i = 0; i < count; ++i) {
    FT_ASSERT_OK(SumSquares<float>(spans[i].data, spans[i].n, one_ws.get(), one.get(), false, stream_));
    FT_ASSERT_OK(SumSquares<float>(spans[i].data, spans[i].n, one_ws.get(), chained.get(), i > 0, stream_));
    const double want = one.Download()[0];
    EXPECT_EQ(std::memcmp(&got[i], &want, sizeof(double)), 0)
        << "tensor " << i << ": " << got[i] << " vs " << want;
    added = i == 0 ? got[0] : added + got[i];
  }
  const double want_total = chained.Download()[0];
  EXPECT_EQ(std::memcmp(&added, &want_total, sizeof(double)), 0) << added << " vs " << want_total;
}

TEST_F(CudaOpsTest, ClipMultiplierFollowsClipGradNorm) {
  DeviceBuffer<double> ss(std::vector<double>{400.0 * 1024.0 * 1024.0});  // scaled norm 20480
  DeviceBuffer<float> inv(std::vector<float>{1.0f / 1024.0f}), mult(1);
  FT_ASSERT_OK(ClipMultiplier(ss.get(), 1.0f, inv.get(), mult.get(), stream_));
  EXPECT_FLOAT_EQ(mult.Download()[0], static_cast<float>(1.0 / 1024.0 * (1.0 / (20.0 + 1e-6))));
  FT_ASSERT_OK(ClipMultiplier(ss.get(), 100.0f, inv.get(), mult.get(), stream_));
  EXPECT_FLOAT_EQ(mult.Download()[0], 1.0f / 1024.0f);  // norm 20 < 100: no clipping
}

TEST_F(CudaOpsTest, AxpyScaleConvertMatchCpu) {
  const int64_t n = 5001;
  const std::vector<float> x = Random(n), y0 = Random(n);
  DeviceBuffer<float> dx(x), dy(y0);
  FT_ASSERT_OK(Axpy<float>(n, 0.3f, dx.get(), dy.get(), stream_));
  FT_ASSERT_OK(Scale<float>(n, -2.0f, dx.get(), stream_));
  std::vector<float> y = y0, xs = x;
  cpu::Axpy<float>(n, 0.3f, x.data(), y.data());
  cpu::Scale<float>(n, -2.0f, xs.data());
  EXPECT_TRUE(Close("axpy", dy.Download(), y, kF32Bound));
  EXPECT_TRUE(Close("scale", dx.Download(), xs, kF32Bound));
  DeviceBuffer<float> src(x);
  DeviceBuffer<bf16> as_bf16(n);
  DeviceBuffer<fp16> as_fp16(n);
  as_bf16.Poison();
  as_fp16.Poison();
  FT_ASSERT_OK((Convert<float, bf16>(src.get(), n, as_bf16.get(), stream_)));
  FT_ASSERT_OK((Convert<float, fp16>(src.get(), n, as_fp16.get(), stream_)));
  EXPECT_TRUE(Close("convert bf16", as_bf16.DownloadFloat(), RoundTo<bf16>(x), 0.0));  // same rounding: exact
  EXPECT_TRUE(Close("convert fp16", as_fp16.DownloadFloat(), RoundTo<fp16>(x), 0.0));
}

// torch.cuda.amp.GradScaler's update rule, replayed on the host.
TEST_F(CudaOpsTest, LossScalerFollowsGradScaler) {
  LossScalerParams p;
  p.growth_interval = 3;
  DeviceBuffer<float> scale(std::vector<float>{65536.0f}), inv(1);
  DeviceBuffer<int> tracker(std::vector<int>{0}), found(1);
  float want_scale = 65536.0f;
  int want_tracker = 0;
  for (int overflow : {0, 0, 0, 1, 0, 1, 0, 0, 0, 0}) {
    FT_CUDA_TEST_CHECK(cudaMemcpy(found.get(), &overflow, sizeof(int), cudaMemcpyHostToDevice));
    FT_ASSERT_OK(UpdateLossScale(p, found.get(), scale.get(), inv.get(), tracker.get(), stream_));
    if (overflow) {
      want_scale *= p.backoff_factor;
      want_tracker = 0;
    } else if (++want_tracker == p.growth_interval) {
      want_scale *= p.growth_factor;
      want_tracker = 0;
    }
    EXPECT_EQ(scale.Download()[0], want_scale);
    EXPECT_EQ(tracker.Download()[0], want_tracker);
    EXPECT_EQ(inv.Download()[0], 1.0f / want_scale);
  }
  // Unscaling: values are multiplied, and one inf anywhere sets found_inf.
  const int64_t n = 3001;
  std::vector<float> g = Random(n);
  DeviceBuffer<float> dg(g), dinv(std::vector<float>{0.25f});
  DeviceBuffer<fp16> dh(Encode<fp16>(g));
  DeviceBuffer<int> flag(std::vector<int>{0});
  FT_ASSERT_OK(UnscaleAndCheckFinite<float>(dg.get(), n, dinv.get(), flag.get(), stream_));
  EXPECT_EQ(flag.Download()[0], 0);
  std::vector<float> want = g;
  cpu::Scale<float>(n, 0.25f, want.data());
  EXPECT_TRUE(Close("unscale", dg.Download(), want, 0.0));
  std::vector<fp16> with_inf = Encode<fp16>(g);
  with_inf[1234] = FromFloat<fp16>(INFINITY);
  dh.Upload(with_inf);
  FT_ASSERT_OK(UnscaleAndCheckFinite<fp16>(dh.get(), n, dinv.get(), flag.get(), stream_));
  EXPECT_EQ(flag.Download()[0], 1);
}

}  // namespace
}  // namespace ft::cuda::testing
