// engine/model/backend.h: the factory (CPU always; CUDA only with a device, with a
// clear error otherwise), tracked device buffers and the CPU backend's copies.
// The CPU backend's ops are covered by every model test (golden, gradcheck,
// checkpoint bit-identity), which run through it.
#include "engine/model/backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <new>
#include <vector>

#include "kernels/cpu/dtype.h"

namespace ft {
namespace {

TEST(Backend, ParsesDeviceKinds) {
  EXPECT_EQ(*ParseDeviceKind("cpu"), DeviceKind::kCpu);
  EXPECT_EQ(*ParseDeviceKind("cuda"), DeviceKind::kCuda);
  EXPECT_FALSE(ParseDeviceKind("tpu").ok());
  EXPECT_STREQ(DeviceKindName(DeviceKind::kCuda), "cuda");
}

TEST(Backend, CpuAlwaysExists) {
  auto cpu = CreateBackend(DeviceKind::kCpu);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ((*cpu)->kind(), DeviceKind::kCpu);
  EXPECT_EQ(cpu->get(), CpuBackendInstance().get());
}

// The CPU backends run their own attention: flash and auto are theirs, an explicit cudnn is refused with the
// fix.
TEST(Backend, CpuRefusesTheCudnnAttentionRoute) {
  auto cpu = CreateBackend(DeviceKind::kCpu);
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE((*cpu)->SetAttentionRoute(AttentionRouteRequest::kOurs).ok());
  EXPECT_TRUE((*cpu)->SetAttentionRoute(AttentionRouteRequest::kAuto).ok());
  const Status cudnn = (*cpu)->SetAttentionRoute(AttentionRouteRequest::kCudnn);
  EXPECT_EQ(cudnn.code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(cudnn.message().find("train.attention: cudnn runs on the CUDA backend, not on "),
            std::string::npos)
      << cudnn.ToString();
  EXPECT_NE(cudnn.message().find("; use attention: flash (or auto)"), std::string::npos);
  EXPECT_TRUE((*cpu)->SetAttentionRoute(AttentionRouteRequest::kOurs).ok());
}

TEST(Backend, CudaWithoutDeviceIsAClearError) {
  auto cuda = CreateBackend(DeviceKind::kCuda);
  if (cuda.ok()) {
    EXPECT_EQ((*cuda)->kind(), DeviceKind::kCuda);
    GTEST_SKIP() << "a CUDA device is present: " << (*cuda)->Describe();
  }
  const std::string msg = cuda.status().ToString();
#ifdef FT_HAVE_CUDA
  EXPECT_NE(msg.find("no CUDA device"), std::string::npos) << msg;
#else
  EXPECT_NE(msg.find("without the CUDA toolkit"), std::string::npos) << msg;
#endif
}

TEST(Backend, BuffersAreTrackedZeroedAndMovable) {
  MemoryTracker tracker;
  Backend& be = *CpuBackendInstance();
  {
    DeviceBuffer a = be.Alloc(10, MemCategory::kActivations, &tracker);
    EXPECT_EQ(a.size(), 10);
    EXPECT_EQ(tracker.current(MemCategory::kActivations), 40);
    std::vector<float> host(10, 1.0f);
    be.CopyToHost(host.data(), a.data(), a.bytes());
    for (float v : host) EXPECT_EQ(v, 0.0f);
    DeviceBuffer b = std::move(a);
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(tracker.current(MemCategory::kActivations), 40);
    DeviceBuffer c = be.AllocBytes(6, MemCategory::kWorkspace, &tracker);
    EXPECT_EQ(tracker.current(MemCategory::kWorkspace), 6);
    b = std::move(c);  // frees b's floats
    EXPECT_EQ(tracker.current(MemCategory::kActivations), 0);
    EXPECT_EQ(tracker.current_total(), 6);
  }
  EXPECT_EQ(tracker.current_total(), 0);
  EXPECT_EQ(tracker.peak_total(), 46);
}

TEST(Backend, CpuCopiesAndOps) {
  Backend& be = *CpuBackendInstance();
  DeviceBuffer x = be.Alloc(4, MemCategory::kWorkspace), y = be.Alloc(4, MemCategory::kWorkspace);
  const float in[4] = {1, 2, 3, 4};
  be.CopyToDevice(x.data(), in, sizeof(in));
  be.Copy(y.data(), x.data(), sizeof(in));
  be.Axpy(4, 2.0f, x.data(), y.data());  // y = 3x
  be.AddBias(y.data(), x.data(), 2, 2);  // rows (3,6) + (1,2), (9,12) + (1,2)
  float out[4];
  be.CopyToHost(out, y.data(), sizeof(out));
  EXPECT_EQ(out[0], 4.0f);
  EXPECT_EQ(out[1], 8.0f);
  EXPECT_EQ(out[2], 10.0f);
  EXPECT_EQ(out[3], 14.0f);
  EXPECT_EQ(be.SumSquares({{x.data(), 4}}), 30.0);
  EXPECT_EQ(be.SumSquares({{x.data(), 4}, {x.data() + 1, 2}}), 30.0 + 13.0);  // 4 + 9 of {1, 2, 3, 4}
  EXPECT_TRUE(be.Synchronize().ok());
}

// A gradient stored as the activations are (bf16 here) reads as its widened values: RMSNorm's
// and the bias's backward give what they give from those values in fp32, and SwiGLU's backward
// stores what it computes from them, rounded. A gradient in another 16-bit type is a caller bug.
TEST(Backend, GradientsStoredAsTheActivationsReadAndWriteTheirValues) {
  Backend& be = *CpuBackendInstance();
  const int64_t rows = 3, D = 8, n = rows * D;
  std::vector<float> x(n), dy(n), w(D, 1.25f);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = 0.3f * static_cast<float>(i % 7) - 0.9f;
    dy[i] = 0.01f * static_cast<float>(i * i % 13) - 0.05f;
  }
  cpu::RoundToBf16(x.data(), n);
  cpu::RoundToBf16(dy.data(), n);  // representable: the stored copy holds exactly these values
  std::vector<uint16_t> x16(n), dy16(n);
  cpu::NarrowTo16(true, x.data(), n, x16.data());
  cpu::NarrowTo16(true, dy.data(), n, dy16.data());
  const ConstAct xs(x16.data(), ActDType::kBF16), dys(dy16.data(), ActDType::kBF16);
  std::vector<float> rstd(rows), y(n), dx(n), dx_ref(n), dw(D, 0.0f), dw_ref(D, 0.0f), db(D, 0.0f),
      db_ref(D, 0.0f);
  std::vector<uint16_t> y16(n);
  be.RmsNormForward(xs, w.data(), rows, D, 1e-5f, Act(y16.data(), ActDType::kBF16), rstd.data());
  be.RmsNormBackward(xs, w.data(), rstd.data(), dys, rows, D, dx.data(), dw.data());
  be.RmsNormBackward(xs, w.data(), rstd.data(), dy.data(), rows, D, dx_ref.data(), dw_ref.data());
  EXPECT_EQ(dx, dx_ref);
  EXPECT_EQ(dw, dw_ref);
  be.BiasGrad(dys, rows, D, db.data());
  be.BiasGrad(dy.data(), rows, D, db_ref.data());
  EXPECT_EQ(db, db_ref);

  std::vector<uint16_t> dg16(n), du16(n);
  std::vector<float> dg(n), du(n), dg_ref(n), du_ref(n);
  be.GluBackward(Activation::kSilu, xs, xs, dys, n, Act(dg16.data(), ActDType::kBF16),
                 Act(du16.data(), ActDType::kBF16));
  be.GluBackward(Activation::kSilu, xs, xs, dy.data(), n, dg_ref.data(), du_ref.data());
  cpu::WidenFrom16(true, dg16.data(), n, dg.data());
  cpu::WidenFrom16(true, du16.data(), n, du.data());
  cpu::RoundToBf16(dg_ref.data(), n);
  cpu::RoundToBf16(du_ref.data(), n);
  EXPECT_EQ(dg, dg_ref);
  EXPECT_EQ(du, du_ref);
  EXPECT_DEATH(be.RmsNormBackward(xs, w.data(), rstd.data(), ConstAct(dy16.data(), ActDType::kF16), rows, D,
                                  dx.data(), nullptr),
               "");
}

// GemmOperands::kBF16 (kF16) is the fp32 GEMM of the operands rounded to
// bf16 (fp16): the same as rounding them first, different from fp32 on
// inputs the format cannot hold, identical on inputs it can; strided
// (ld > cols) and transposed operands too.
TEST(Backend, LowPrecisionOperandGemmRoundsTheOperandsFirst) {
  Backend& be = *CpuBackendInstance();
  const int64_t M = 5, N = 7, K = 9, lda = 11, ldb = 12;  // A^T stored [K, lda], B stored [N, ldb]
  std::vector<float> a(K * lda), b(N * ldb);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 1.0f + 0.001f * static_cast<float>(i % 17) + 1e-5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -0.5f + 0.0137f * static_cast<float>(i % 23) + 3e-6f;
  for (GemmOperands operands : {GemmOperands::kBF16, GemmOperands::kF16}) {
    SCOPED_TRACE(operands == GemmOperands::kBF16 ? "bf16" : "fp16");
    std::vector<float> c16(M * N, 0.0f), c32(M * N, 0.0f), c_rounded(M * N, 0.0f);
    be.Gemm(operands, true, true, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c16.data(), N);
    be.Gemm(GemmOperands::kF32, true, true, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c32.data(), N);
    std::vector<float> ar = a, br = b;
    for (std::vector<float>* x : {&ar, &br}) {
      if (operands == GemmOperands::kBF16) {
        be.RoundToBf16(x->data(), static_cast<int64_t>(x->size()));
      } else {
        be.RoundToFp16(x->data(), static_cast<int64_t>(x->size()));
      }
    }
    be.Gemm(GemmOperands::kF32, true, true, M, N, K, 1.0f, ar.data(), lda, br.data(), ldb, 0.0f,
            c_rounded.data(), N);
    EXPECT_EQ(c16, c_rounded);
    EXPECT_NE(c16, c32);
    std::vector<float> again(M * N, 0.0f);
    be.Gemm(operands, true, true, M, N, K, 1.0f, ar.data(), lda, br.data(), ldb, 0.0f, again.data(), N);
    EXPECT_EQ(again, c_rounded);  // exact inputs: nothing left to round
    // Converted to 16-bit storage first (the model converts a gradient once for its GEMMs): the same.
    const ActDType t = operands == GemmOperands::kBF16 ? ActDType::kBF16 : ActDType::kF16;
    std::vector<uint16_t> a16(a.size()), b16(b.size());
    be.Convert(ConstAct(a.data()), static_cast<int64_t>(a.size()), Act(a16.data(), t));
    be.Convert(ConstAct(b.data()), static_cast<int64_t>(b.size()), Act(b16.data(), t));
    std::vector<float> stored(M * N, 0.0f);
    be.Gemm(operands, true, true, M, N, K, 1.0f, ConstAct(a16.data(), t), lda, ConstAct(b16.data(), t), ldb,
            0.0f, stored.data(), N);
    EXPECT_EQ(stored, c16);
  }
  // The two formats round differently: fp16 keeps 3 more mantissa bits.
  std::vector<float> x16 = a, xb = a;
  be.RoundToFp16(x16.data(), static_cast<int64_t>(x16.size()));
  be.RoundToBf16(xb.data(), static_cast<int64_t>(xb.size()));
  EXPECT_NE(x16, xb);
}

// A typed linear's last step (LinearOutput) against fp64 arithmetic written here: c + alpha ·
// xa·Bᵀ, rounded to the storage type, plus the residual, rounded again; without a residual rounded
// once; without LoRA (r = 0) a conversion. Every result within half an ulp of the 16-bit type of
// the exact value (the fp32 sums' error is far below it), so it is that value's rounding unless
// the exact value lies within fp32 noise of a tie (these inputs are not).
TEST(Backend, LinearOutputAddsLorasProductRoundsAndAddsTheResidual) {
  Backend& be = *CpuBackendInstance();
  const int64_t rows = 6, n = 10, r = 4;
  const float alpha = 1.5f;
  for (const ActDType t : {ActDType::kBF16, ActDType::kF16}) {
    SCOPED_TRACE(ActDTypeName(t));
    const auto round = [&](double v) {
      const float f = static_cast<float>(v);
      return t == ActDType::kBF16 ? cpu::Bf16ToFloat(cpu::FloatToBf16(f))
                                  : cpu::HalfToFloat(cpu::FloatToHalf(f));
    };
    const auto codes = [&](const std::vector<float>& v) {
      std::vector<uint16_t> out(v.size());
      be.Convert(ConstAct(v.data()), static_cast<int64_t>(v.size()), Act(out.data(), t));
      return out;
    };
    const auto widen = [&](const std::vector<uint16_t>& v) {
      std::vector<float> out(v.size());
      be.Convert(ConstAct(v.data(), t), static_cast<int64_t>(v.size()), Act(out.data()));
      return out;
    };
    std::vector<float> xa(rows * r), b(n * r), c0(rows * n), res(rows * n);
    for (size_t i = 0; i < xa.size(); ++i) xa[i] = round(0.3 * std::sin(1.0 + static_cast<double>(i)));
    for (size_t i = 0; i < b.size(); ++i) b[i] = round(0.2 * std::cos(2.0 + static_cast<double>(i)));
    for (size_t i = 0; i < c0.size(); ++i)
      c0[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
    for (size_t i = 0; i < res.size(); ++i) res[i] = round(std::cos(0.11 * static_cast<double>(i)));
    const std::vector<uint16_t> xa16 = codes(xa), b16 = codes(b), res16 = codes(res);
    for (const bool with_residual : {false, true}) {
      for (const int64_t rank : {r, int64_t{0}}) {
        std::vector<float> c = c0;
        std::vector<uint16_t> y = with_residual ? res16 : std::vector<uint16_t>(rows * n);
        const ConstAct residual(y.data(), t);  // aliasing y, as the model's o and down projections do
        be.LinearOutput(rows, n, rank, alpha, ConstAct(xa16.data(), t), ConstAct(b16.data(), t), c.data(),
                        with_residual ? &residual : nullptr, Act(y.data(), t));
        const std::vector<float> got = widen(y);
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double v = c0[i * n + j];
            for (int64_t k = 0; k < rank; ++k) v += alpha * static_cast<double>(xa[i * r + k]) * b[j * r + k];
            const double want =
                with_residual ? round(round(v) + static_cast<double>(res[i * n + j])) : round(v);
            EXPECT_EQ(got[i * n + j], want)
                << "row " << i << " col " << j << " rank " << rank << (with_residual ? " with residual" : "");
          }
        }
      }
    }
  }
}

// NF4 dequantized straight to a 16-bit operand gives the codes of the fp32 dequantization
// rounded to nearest even (what the model used to get by dequantizing to fp32 and rounding in
// place), for bf16 and fp16, with and without double quantization.
TEST(Backend, Nf4DequantizedToSixteenBitsIsTheFp32ValuesRounded) {
  Backend& be = *CpuBackendInstance();
  const int64_t n = 1000;
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = 0.37f * static_cast<float>((i * 7919) % 201 - 100) / 100.0f;
  for (const bool dq : {true, false}) {
    const cpu::Nf4Tensor q = cpu::QuantizeNf4(values.data(), n, {64, dq, 256});
    const cpu::Nf4Layout layout = cpu::Nf4BlobLayout(q);
    std::vector<uint8_t> blob(static_cast<size_t>(layout.bytes));
    cpu::PackNf4Blob(q, layout, blob.data());
    std::vector<float> f32(n);
    be.DequantizeNf4(layout, blob.data(), f32.data());
    for (const ActDType t : {ActDType::kBF16, ActDType::kF16}) {
      std::vector<float> rounded = f32;
      if (t == ActDType::kBF16) {
        be.RoundToBf16(rounded.data(), n);
      } else {
        be.RoundToFp16(rounded.data(), n);
      }
      std::vector<uint16_t> codes(n);
      be.DequantizeNf4(layout, blob.data(), Act(codes.data(), t));
      std::vector<float> widened(n);
      be.Convert(ConstAct(codes.data(), t), n, widened.data());
      EXPECT_EQ(widened, rounded) << ActDTypeName(t) << (dq ? " double quant" : "");
    }
  }
}

// The guarded backend: the CPU's results, device memory out of the host's
// reach between calls, and a capacity like a device's.
TEST(GuardedBackend, SameResultsAsTheCpu) {
  auto guarded = MakeGuardedCpuBackend(int64_t{1} << 20);
  Backend& cpu = *CpuBackendInstance();
  std::vector<float> a(6 * 4), b(4 * 5);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.25f * static_cast<float>(i % 7) - 0.6f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.1f * static_cast<float>(i % 5) + 0.01f;
  DeviceBuffer da = guarded->Alloc(24, MemCategory::kWorkspace),
               db = guarded->Alloc(20, MemCategory::kWorkspace),
               dc = guarded->Alloc(30, MemCategory::kWorkspace);
  guarded->CopyToDevice(da.data(), a.data(), 24 * 4);
  guarded->CopyToDevice(db.data(), b.data(), 20 * 4);
  guarded->Gemm(GemmOperands::kF32, false, false, 6, 5, 4, 1.0f, da.data(), 4, db.data(), 5, 0.0f, dc.data(),
                5);
  guarded->Axpy(30, 0.5f, dc.data(), dc.data());
  std::vector<float> got(30), want(30, 0.0f);
  guarded->CopyToHost(got.data(), dc.data(), 30 * 4);
  cpu.Gemm(GemmOperands::kF32, false, false, 6, 5, 4, 1.0f, a.data(), 4, b.data(), 5, 0.0f, want.data(), 5);
  cpu.Axpy(30, 0.5f, want.data(), want.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(guarded->SumSquares({{dc.data(), 30}}), cpu.SumSquares({{want.data(), 30}}));
}

TEST(GuardedBackend, CountsAgainstItsCapacity) {
  auto guarded = MakeGuardedCpuBackend(int64_t{1} << 20);  // 1 MiB
  auto info = guarded->MemoryInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->second, int64_t{1} << 20);
  DeviceBuffer x = guarded->AllocBytes(600 << 10, MemCategory::kWorkspace);
  EXPECT_EQ(guarded->MemoryInfo()->first, (1 << 20) - (600 << 10));
  EXPECT_THROW(guarded->AllocBytes(600 << 10, MemCategory::kWorkspace), std::bad_alloc);
  x = DeviceBuffer();  // freed: the space is whole again
  DeviceBuffer y = guarded->AllocBytes(1 << 20, MemCategory::kWorkspace);
  EXPECT_EQ(y.bytes(), 1 << 20);
}

TEST(GuardedBackendDeathTest, HostDereferenceOfDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto guarded = MakeGuardedCpuBackend(int64_t{1} << 20);
  DeviceBuffer x = guarded->Alloc(16, MemCategory::kWorkspace);
  float host = 0.0f;
  guarded->CopyToHost(&host, x.data(), 4);  // through the backend: fine
  EXPECT_EQ(host, 0.0f);
  EXPECT_DEATH({ std::printf("%f\n", static_cast<double>(*static_cast<volatile float*>(x.data()))); }, "");
}

}  // namespace
}  // namespace ft
