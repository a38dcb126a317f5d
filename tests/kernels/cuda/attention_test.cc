// Flash attention forward/backward on CUDA against the CPU reference in
// double (cpu::AttentionForwardNaive / AttentionBackward), over head dims 64,
// 128 and 256, GQA groups, sequence lengths that end mid-tile, tiles wholly
// below the diagonal, packed documents (segment masks), queries after cached
// keys, sliding windows (Mistral, Gemma's local layers; with documents and
// after cached keys too) and soft-capped scores (Gemma 2); for both kernels
// (ops.h's AttentionMath): fp32 on CUDA cores, and tensor cores with bf16
// operands (bf16 storage, or fp32 storage of bf16-rounded values as the
// engine keeps them), whose products round P and dS to bf16 (bound
// kHalfBound). Backward also has to be bit-identical run to run.
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
  int64_t window = 0;  // AttentionShape::window
  double softcap = 0;  // AttentionShape::softcap
};

std::string Name(const Case& c) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "b%ld T%ld H%ld/%ld d%ld%s w%ld cap%g", static_cast<long>(c.batch),
                static_cast<long>(c.seq), static_cast<long>(c.q_heads), static_cast<long>(c.kv_heads),
                static_cast<long>(c.head_dim), c.segmented ? " seg" : "", static_cast<long>(c.window),
                c.softcap);
  return buf;
}

const Case kCases[] = {
    {2, 77, 4, 2, 64, false},   {1, 130, 6, 1, 128, false}, {2, 33, 2, 2, 128, true},
    {1, 257, 4, 4, 64, true},   {3, 1, 2, 1, 64, false},    {1, 64, 8, 2, 128, false},
    {2, 320, 4, 2, 128, false}, {1, 200, 2, 1, 64, false},
};

// Sliding windows: narrower than a tile, a tile multiple (window edges on
// tile edges), with documents, and wider than the sequence (no effect). A
// window of 1 (each query sees only itself) is a forward case only: its
// dq and dk are 0 up to rounding, which a relative bound cannot judge.
const Case kWindowCases[] = {
    {1, 200, 4, 2, 64, false, 37},   {2, 200, 2, 1, 128, true, 37},   {1, 300, 2, 2, 64, false, 64},
    {1, 333, 2, 1, 128, false, 100}, {1, 100, 2, 1, 64, false, 1000},
};
const Case kWindowOfOne{1, 130, 2, 1, 128, false, 1};
// Soft-capping at Gemma 2's 50 with scores large enough that tanh saturates
// (QueryKeyValues), alone and with a window.
const Case kSoftcapCases[] = {
    {2, 77, 4, 2, 64, false, 0, 50.0},
    {1, 130, 2, 1, 128, true, 0, 50.0},
    {1, 200, 4, 2, 64, true, 37, 50.0},
    {1, 257, 2, 2, 128, false, 100, 30.0},
};
// Gemma's head dim: plain, documents, window and cap, a window across the
// tensor-core kernels' 64-row tiles.
const Case kHeadDim256Cases[] = {
    {2, 77, 4, 2, 256, false},
    {1, 130, 2, 1, 256, true},
    {1, 200, 2, 2, 256, false, 37, 50.0},
    {1, 333, 2, 1, 256, false, 100},
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
    in.s.window = c.window;
    in.s.softcap = c.softcap;
    const int64_t rows = c.batch * c.seq;
    auto round = [&](std::vector<float> x) {
      return math == AttentionMath::kBf16 ? RoundTo<bf16>(RoundTo<T>(std::move(x)))
                                          : RoundTo<T>(std::move(x));
    };
    in.q = round(QueryKeyValues(rows * c.q_heads * c.head_dim, c.softcap));
    in.k = round(QueryKeyValues(rows * c.kv_heads * c.head_dim, c.softcap));
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

  // q and k: uniform in [-2, 2]; with a soft-cap, integers in [-12, 12]
  // (exact in bf16, and their dot products exact in fp32), so scale * q·k
  // has a standard deviation near 52: about a sixth of the scores are past
  // 1.4 caps of 50 (tanh > 0.89, slope < 0.2), and the softmax still spreads
  // over several keys (its gradients are not all cancellation).
  std::vector<float> QueryKeyValues(int64_t n, double softcap) {
    if (softcap == 0) return Random(n, -2, 2);
    std::vector<float> x(n);
    for (float& v : x) v = static_cast<float>(RandomInt(-12, 12));
    return x;
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

  // Forward of `seq` queries after `past` cached keys (fp32 storage; bf16
  // values for kBf16), 2 sequences, 4 query heads on 2 kv heads.
  void CheckForwardAfterCachedKeys(int64_t seq, int64_t past, int64_t hd, int64_t window,
                                   AttentionMath math) {
    AttentionShape s{2, seq, 4, 2, hd, 1.0 / std::sqrt(static_cast<double>(hd))};
    s.kv_seq = seq + past;
    s.window = window;
    auto round = [&](std::vector<float> x) { return math == AttentionMath::kBf16 ? RoundTo<bf16>(x) : x; };
    const std::vector<float> qv = round(Random(s.batch * seq * s.q_heads * hd, -2, 2));
    const std::vector<float> kv = round(Random(s.batch * s.kv_seq * s.kv_heads * hd, -2, 2));
    const std::vector<float> vv = round(Random(s.batch * s.kv_seq * s.kv_heads * hd));
    DeviceBuffer<float> q(qv), k(kv), v(vv), out(qv.size()), lse(s.batch * s.q_heads * seq);
    out.Poison();
    lse.Poison();
    FT_ASSERT_OK(
        AttentionForward<float>(s, q.get(), k.get(), v.get(), nullptr, out.get(), lse.get(), stream_, math));
    std::vector<double> ref_out(qv.size()), ref_lse(lse.size());
    cpu::AttentionForwardNaive<double>(s, ToDouble(qv).data(), ToDouble(kv).data(), ToDouble(vv).data(),
                                       nullptr, ref_out.data(), ref_lse.data());
    const std::string name = "cached keys seq " + std::to_string(seq) + " past " + std::to_string(past) +
                             " d" + std::to_string(hd) + " w" + std::to_string(window) +
                             (math == AttentionMath::kBf16 ? " tc" : " fp32");
    EXPECT_TRUE(Close("attention out " + name, out.Download(), ref_out, OutBound<float>(math)));
    EXPECT_TRUE(Close("attention lse " + name, lse.Download(), ref_lse, kF32Bound));
  }

  // Forward and backward of `c` on every kernel: fp32, bf16 storage, and fp32
  // storage on tensor cores.
  void CheckAllKernels(const Case& c, bool backward) {
    CheckForward<float>(c, AttentionMath::kFp32);
    CheckForward<bf16>(c, AttentionMath::kBf16);
    CheckForward<float>(c, AttentionMath::kBf16);
    if (!backward) return;
    CheckBackward<float>(c, AttentionMath::kFp32);
    CheckBackward<bf16>(c, AttentionMath::kBf16);
    CheckBackward<float>(c, AttentionMath::kBf16);
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
         {std::tuple<int64_t, int64_t, int64_t>{1, 70, 64}, {5, 130, 128}, {64, 64, 64}, {3, 100, 256}}) {
      CheckForwardAfterCachedKeys(seq, past, hd, 0, math);
    }
  }
}

// A sliding window over cached keys: query i at position i + past sees the
// window keys before it, so whole cached tiles before the window are skipped.
TEST_F(CudaAttentionTest, SlidingWindowAfterCachedKeysMatchesCpu) {
  for (const AttentionMath math : {AttentionMath::kFp32, AttentionMath::kBf16}) {
    for (const auto& [seq, past, hd, window] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 70, 64, 16},
                                                {5, 130, 128, 37},
                                                {64, 64, 64, 20},
                                                {100, 200, 128, 64},
                                                {3, 300, 256, 100}}) {
      CheckForwardAfterCachedKeys(seq, past, hd, window, math);
    }
  }
}

TEST_F(CudaAttentionTest, SlidingWindowMatchesCpuOnEveryKernel) {
  for (const Case& c : kWindowCases) CheckAllKernels(c, /*backward=*/true);
  CheckAllKernels(kWindowOfOne, /*backward=*/false);
}

TEST_F(CudaAttentionTest, SoftCappedScoresMatchCpuOnEveryKernel) {
  for (const Case& c : kSoftcapCases) CheckAllKernels(c, /*backward=*/true);
}

TEST_F(CudaAttentionTest, HeadDim256MatchesCpuOnEveryKernel) {
  for (const Case& c : kHeadDim256Cases) CheckAllKernels(c, /*backward=*/true);
}

TEST_F(CudaAttentionTest, NegativeWindowOrSoftcapIsInvalidArgument) {
  DeviceBuffer<float> buf(4 * 64);
  AttentionShape s{1, 4, 1, 1, 64, 0.125};
  s.window = -1;
  EXPECT_TRUE(
      AttentionForward<float>(s, buf.get(), buf.get(), buf.get(), nullptr, buf.get(), buf.get(), stream_)
          .IsInvalidArgument());
  s.window = 0;
  s.softcap = -1;
  DeviceBuffer<float> ws(AttentionBackwardWorkspaceFloats(s));
  const Status backward =
      AttentionBackward<float, float>(s, buf.get(), buf.get(), buf.get(), nullptr, buf.get(), buf.get(),
                                      buf.get(), buf.get(), buf.get(), buf.get(), ws.get(), stream_);
  EXPECT_TRUE(backward.IsInvalidArgument()) << backward.ToString();
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
