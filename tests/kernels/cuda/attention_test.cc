// Flash attention forward/backward on CUDA against the CPU reference in
// double (cpu::AttentionForwardNaive / AttentionBackward), over head dims 64
// and 128, GQA groups, sequence lengths that end mid-tile, tiles wholly below
// the diagonal, packed documents (segment masks) and queries after cached
// keys; for both kernels (ops.h's AttentionMath): fp32 on CUDA cores, and
// tensor cores with bf16 operands (bf16 storage, or fp32 storage of
// bf16-rounded values as the engine keeps them), whose products round P and
// dS to bf16 (bound kHalfBound). Backward also has to be bit-identical run to
// run.
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>

#include "tests/kernels/cuda/harness.h"

namespace ft::cuda::testing {
namespace {

struct Case {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
  bool segmented;
};

std::string Name(const Case& c) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "b%ld T%ld H%ld/%ld d%ld%s", static_cast<long>(c.batch),
                static_cast<long>(c.seq), static_cast<long>(c.q_heads), static_cast<long>(c.kv_heads),
                static_cast<long>(c.head_dim), c.segmented ? " seg" : "");
  return buf;
}

const Case kCases[] = {
    {2, 77, 4, 2, 64, false},   {1, 130, 6, 1, 128, false}, {2, 33, 2, 2, 128, true},
    {1, 257, 4, 4, 64, true},   {3, 1, 2, 1, 64, false},    {1, 64, 8, 2, 128, false},
    {2, 320, 4, 2, 128, false}, {1, 200, 2, 1, 64, false},
};

class CudaAttentionTest : public CudaOpTest {
 protected:
  struct Inputs {
    AttentionShape s;
    std::vector<float> q, k, v, dout;
    std::vector<int32_t> segments;  // empty: no mask
  };

  // Inputs rounded to T (to bf16 for kBf16 math), so the double reference
  // sees exactly what the GPU does.
  template <typename T>
  Inputs MakeInputs(const Case& c, AttentionMath math) {
    Inputs in;
    in.s = {c.batch,    c.seq,      c.q_heads,
            c.kv_heads, c.head_dim, 1.0 / std::sqrt(static_cast<double>(c.head_dim))};
    const int64_t rows = c.batch * c.seq;
    auto round = [&](std::vector<float> x) {
      return math == AttentionMath::kBf16 ? RoundTo<bf16>(RoundTo<T>(std::move(x)))
                                          : RoundTo<T>(std::move(x));
    };
    in.q = round(Random(rows * c.q_heads * c.head_dim, -2, 2));
    in.k = round(Random(rows * c.kv_heads * c.head_dim, -2, 2));
    in.v = round(Random(rows * c.kv_heads * c.head_dim));
    in.dout = round(Random(rows * c.q_heads * c.head_dim));
    if (c.segmented) {  // packed documents of random lengths 1..40, ids increasing per sequence
      in.segments.resize(rows);
      for (int64_t b = 0; b < c.batch; ++b) {
        int32_t id = 0;
        for (int64_t i = 0, left = 0; i < c.seq; ++i, --left) {
          if (left == 0) {
            left = RandomInt(1, 40);
            ++id;
          }
          in.segments[b * c.seq + i] = id;
        }
      }
    }
    return in;
  }

  const int32_t* Segments(const Inputs& in) { return in.segments.empty() ? nullptr : in.segments.data(); }

  template <typename T>
  static double OutBound(AttentionMath math) {
    return math == AttentionMath::kBf16 ? kHalfBound : Bound<T>();
  }

  template <typename T>
  void CheckForward(const Case& c, AttentionMath math) {
    const Inputs in = MakeInputs<T>(c, math);
    const AttentionShape& s = in.s;
    DeviceBuffer<T> q(Encode<T>(in.q)), k(Encode<T>(in.k)), v(Encode<T>(in.v)), out(in.q.size());
    DeviceBuffer<int32_t> seg(in.segments.empty() ? std::vector<int32_t>{0} : in.segments);
    DeviceBuffer<float> lse(s.batch * s.q_heads * s.seq);
    out.Poison();
    lse.Poison();
    FT_ASSERT_OK(AttentionForward<T>(s, q.get(), k.get(), v.get(), in.segments.empty() ? nullptr : seg.get(),
                                     out.get(), lse.get(), stream_, math));
    std::vector<double> ref_out(in.q.size()), ref_lse(lse.size());
    cpu::AttentionForwardNaive<double>(s, ToDouble(in.q).data(), ToDouble(in.k).data(), ToDouble(in.v).data(),
                                       Segments(in), ref_out.data(), ref_lse.data());
    EXPECT_TRUE(Close("attention out " + Name(c), out.DownloadFloat(), ref_out, OutBound<T>(math)));
    EXPECT_TRUE(Close("attention lse " + Name(c), lse.Download(), ref_lse, kF32Bound));
  }

  template <typename T>
  void CheckBackward(const Case& c, AttentionMath math) {
    const Inputs in = MakeInputs<T>(c, math);
    const AttentionShape& s = in.s;
    // out and lse from the reference forward (out rounded to T, as the engine stores it).
    std::vector<double> ref_out(in.q.size()), ref_lse(s.batch * s.q_heads * s.seq);
    const std::vector<double> qd = ToDouble(in.q), kd = ToDouble(in.k), vd = ToDouble(in.v);
    cpu::AttentionForwardNaive<double>(s, qd.data(), kd.data(), vd.data(), Segments(in), ref_out.data(),
                                       ref_lse.data());
    const std::vector<float> out_t = RoundTo<T>(std::vector<float>(ref_out.begin(), ref_out.end()));
    const std::vector<float> lse_f(ref_lse.begin(), ref_lse.end());
    std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
    cpu::AttentionBackward<double>(s, qd.data(), kd.data(), vd.data(), Segments(in), ToDouble(out_t).data(),
                                   ToDouble(lse_f).data(), ToDouble(in.dout).data(), dq.data(), dk.data(),
                                   dv.data());

    DeviceBuffer<T> q(Encode<T>(in.q)), k(Encode<T>(in.k)), v(Encode<T>(in.v)), out(Encode<T>(out_t));
    DeviceBuffer<T> dout(Encode<T>(in.dout)), gq(in.q.size()), gk(in.k.size()), gv(in.v.size());
    DeviceBuffer<float> lse(lse_f), ws(AttentionBackwardWorkspaceFloats(s));
    DeviceBuffer<int32_t> seg(in.segments.empty() ? std::vector<int32_t>{0} : in.segments);
    const int32_t* dseg = in.segments.empty() ? nullptr : seg.get();
    std::vector<float> first[3];
    for (int run = 0; run < 2; ++run) {
      gq.Poison();
      gk.Poison();
      gv.Poison();
      ws.Poison();
      FT_ASSERT_OK(AttentionBackward<T>(s, q.get(), k.get(), v.get(), dseg, out.get(), lse.get(), dout.get(),
                                        gq.get(), gk.get(), gv.get(), ws.get(), stream_, math));
      if (run == 0) {
        first[0] = gq.DownloadFloat();
        first[1] = gk.DownloadFloat();
        first[2] = gv.DownloadFloat();
        EXPECT_TRUE(Close("attention dq " + Name(c), first[0], dq, OutBound<T>(math)));
        EXPECT_TRUE(Close("attention dk " + Name(c), first[1], dk, OutBound<T>(math)));
        EXPECT_TRUE(Close("attention dv " + Name(c), first[2], dv, OutBound<T>(math)));
      } else {
        EXPECT_EQ(gq.DownloadFloat(), first[0]) << "dq differs between runs: " << Name(c);
        EXPECT_EQ(gk.DownloadFloat(), first[1]) << "dk differs between runs: " << Name(c);
        EXPECT_EQ(gv.DownloadFloat(), first[2]) << "dv differs between runs: " << Name(c);
      }
    }
  }
};

TEST_F(CudaAttentionTest, ForwardFp32MatchesCpu) {
  for (const Case& c : kCases) CheckForward<float>(c, AttentionMath::kFp32);
}

TEST_F(CudaAttentionTest, ForwardBf16MatchesCpu) {
  for (const Case& c : kCases) CheckForward<bf16>(c, AttentionMath::kBf16);
}

TEST_F(CudaAttentionTest, ForwardFp32StorageTensorCoresMatchesCpu) {
  for (const Case& c : kCases) CheckForward<float>(c, AttentionMath::kBf16);
}

TEST_F(CudaAttentionTest, BackwardFp32MatchesCpuAndIsDeterministic) {
  for (const Case& c : kCases) CheckBackward<float>(c, AttentionMath::kFp32);
}

TEST_F(CudaAttentionTest, BackwardBf16MatchesCpuAndIsDeterministic) {
  for (const Case& c : kCases) CheckBackward<bf16>(c, AttentionMath::kBf16);
}

TEST_F(CudaAttentionTest, BackwardFp32StorageTensorCoresMatchesCpuAndIsDeterministic) {
  for (const Case& c : kCases) CheckBackward<float>(c, AttentionMath::kBf16);
}

// Queries after cached keys (kv_seq > seq, generation's KV cache) on both kernels.
TEST_F(CudaAttentionTest, ForwardAfterCachedKeysMatchesCpu) {
  for (const AttentionMath math : {AttentionMath::kFp32, AttentionMath::kBf16}) {
    for (const auto& [seq, past, hd] :
         {std::tuple<int64_t, int64_t, int64_t>{1, 70, 64}, {5, 130, 128}, {64, 64, 64}}) {
      AttentionShape s{2, seq, 4, 2, hd, 1.0 / std::sqrt(static_cast<double>(hd))};
      s.kv_seq = seq + past;
      auto round = [&](std::vector<float> x) { return math == AttentionMath::kBf16 ? RoundTo<bf16>(x) : x; };
      const std::vector<float> qv = round(Random(s.batch * seq * s.q_heads * hd, -2, 2));
      const std::vector<float> kv = round(Random(s.batch * s.kv_seq * s.kv_heads * hd, -2, 2));
      const std::vector<float> vv = round(Random(s.batch * s.kv_seq * s.kv_heads * hd));
      DeviceBuffer<float> q(qv), k(kv), v(vv), out(qv.size()), lse(s.batch * s.q_heads * seq);
      out.Poison();
      lse.Poison();
      FT_ASSERT_OK(AttentionForward<float>(s, q.get(), k.get(), v.get(), nullptr, out.get(), lse.get(),
                                           stream_, math));
      std::vector<double> ref_out(qv.size()), ref_lse(lse.size());
      cpu::AttentionForwardNaive<double>(s, ToDouble(qv).data(), ToDouble(kv).data(), ToDouble(vv).data(),
                                         nullptr, ref_out.data(), ref_lse.data());
      const std::string name = "cached keys seq " + std::to_string(seq) + " past " + std::to_string(past) +
                               (math == AttentionMath::kBf16 ? " tc" : " fp32");
      EXPECT_TRUE(Close("attention out " + name, out.Download(), ref_out, OutBound<float>(math)));
      EXPECT_TRUE(Close("attention lse " + name, lse.Download(), ref_lse, kF32Bound));
    }
  }
}

// bf16 tensors that are not 16-byte aligned run the CUDA-core kernels: same answer.
TEST_F(CudaAttentionTest, UnalignedBf16TensorsTakeTheCudaCoreKernels) {
  const Case c{1, 100, 2, 1, 64, false};
  const Inputs in = MakeInputs<bf16>(c, AttentionMath::kBf16);
  const AttentionShape& s = in.s;
  auto shifted = [](std::vector<float> x) {  // one leading element, so x.data() + 1 is 2-byte aligned only
    x.insert(x.begin(), 0.0f);
    return x;
  };
  DeviceBuffer<bf16> q(Encode<bf16>(shifted(in.q))), k(Encode<bf16>(shifted(in.k))),
      v(Encode<bf16>(shifted(in.v)));
  DeviceBuffer<bf16> out(in.q.size() + 1);
  DeviceBuffer<float> lse(s.batch * s.q_heads * s.seq);
  out.Poison();
  FT_ASSERT_OK(AttentionForward<bf16>(s, q.get() + 1, k.get() + 1, v.get() + 1, nullptr, out.get() + 1,
                                      lse.get(), stream_));
  std::vector<double> ref_out(in.q.size()), ref_lse(lse.size());
  cpu::AttentionForwardNaive<double>(s, ToDouble(in.q).data(), ToDouble(in.k).data(), ToDouble(in.v).data(),
                                     nullptr, ref_out.data(), ref_lse.data());
  std::vector<float> got = out.DownloadFloat();
  got.erase(got.begin());
  EXPECT_TRUE(Close("attention out unaligned", got, ref_out, kHalfBound));
}

TEST_F(CudaAttentionTest, UnsupportedHeadDimIsInvalidArgument) {
  DeviceBuffer<float> buf(4 * 96);
  const AttentionShape s{1, 4, 1, 1, 96, 0.1};
  EXPECT_TRUE(
      AttentionForward<float>(s, buf.get(), buf.get(), buf.get(), nullptr, buf.get(), buf.get(), stream_)
          .IsInvalidArgument());
}

}  // namespace
}  // namespace ft::cuda::testing
