// Flash attention forward/backward on CUDA against the CPU reference in
// double (cpu::AttentionForwardNaive / AttentionBackward), over head dims 64
// and 128, GQA groups, sequence lengths that end mid-tile, and packed
// documents (segment masks). Backward also has to be bit-identical run to run.
#include <cmath>
#include <cstdio>

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
    {2, 77, 4, 2, 64, false}, {1, 130, 6, 1, 128, false}, {2, 33, 2, 2, 128, true},
    {1, 257, 4, 4, 64, true}, {3, 1, 2, 1, 64, false},    {1, 64, 8, 2, 128, false},
};

class CudaAttentionTest : public CudaOpTest {
 protected:
  struct Inputs {
    AttentionShape s;
    std::vector<float> q, k, v, dout;
    std::vector<int32_t> segments;  // empty: no mask
  };

  // Inputs rounded to T, so the double reference sees exactly what the GPU does.
  template <typename T>
  Inputs MakeInputs(const Case& c) {
    Inputs in;
    in.s = {c.batch,    c.seq,      c.q_heads,
            c.kv_heads, c.head_dim, 1.0 / std::sqrt(static_cast<double>(c.head_dim))};
    const int64_t rows = c.batch * c.seq;
    in.q = RoundTo<T>(Random(rows * c.q_heads * c.head_dim, -2, 2));
    in.k = RoundTo<T>(Random(rows * c.kv_heads * c.head_dim, -2, 2));
    in.v = RoundTo<T>(Random(rows * c.kv_heads * c.head_dim));
    in.dout = RoundTo<T>(Random(rows * c.q_heads * c.head_dim));
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
  void CheckForward(const Case& c) {
    const Inputs in = MakeInputs<T>(c);
    const AttentionShape& s = in.s;
    DeviceBuffer<T> q(Encode<T>(in.q)), k(Encode<T>(in.k)), v(Encode<T>(in.v)), out(in.q.size());
    DeviceBuffer<int32_t> seg(in.segments.empty() ? std::vector<int32_t>{0} : in.segments);
    DeviceBuffer<float> lse(s.batch * s.q_heads * s.seq);
    out.Poison();
    lse.Poison();
    FT_ASSERT_OK(AttentionForward<T>(s, q.get(), k.get(), v.get(), in.segments.empty() ? nullptr : seg.get(),
                                     out.get(), lse.get(), stream_));
    std::vector<double> ref_out(in.q.size()), ref_lse(lse.size());
    cpu::AttentionForwardNaive<double>(s, ToDouble(in.q).data(), ToDouble(in.k).data(), ToDouble(in.v).data(),
                                       Segments(in), ref_out.data(), ref_lse.data());
    EXPECT_TRUE(Close("attention out " + Name(c), out.DownloadFloat(), ref_out, Bound<T>()));
    EXPECT_TRUE(Close("attention lse " + Name(c), lse.Download(), ref_lse, kF32Bound));
  }

  template <typename T>
  void CheckBackward(const Case& c) {
    const Inputs in = MakeInputs<T>(c);
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
                                        gq.get(), gk.get(), gv.get(), ws.get(), stream_));
      if (run == 0) {
        first[0] = gq.DownloadFloat();
        first[1] = gk.DownloadFloat();
        first[2] = gv.DownloadFloat();
        EXPECT_TRUE(Close("attention dq " + Name(c), first[0], dq, Bound<T>()));
        EXPECT_TRUE(Close("attention dk " + Name(c), first[1], dk, Bound<T>()));
        EXPECT_TRUE(Close("attention dv " + Name(c), first[2], dv, Bound<T>()));
      } else {
        EXPECT_EQ(gq.DownloadFloat(), first[0]) << "dq differs between runs: " << Name(c);
        EXPECT_EQ(gk.DownloadFloat(), first[1]) << "dk differs between runs: " << Name(c);
        EXPECT_EQ(gv.DownloadFloat(), first[2]) << "dv differs between runs: " << Name(c);
      }
    }
  }
};

TEST_F(CudaAttentionTest, ForwardFp32MatchesCpu) {
  for (const Case& c : kCases) CheckForward<float>(c);
}

TEST_F(CudaAttentionTest, ForwardBf16MatchesCpu) {
  for (const Case& c : kCases) CheckForward<bf16>(c);
}

TEST_F(CudaAttentionTest, BackwardFp32MatchesCpuAndIsDeterministic) {
  for (const Case& c : kCases) CheckBackward<float>(c);
}

TEST_F(CudaAttentionTest, BackwardBf16MatchesCpuAndIsDeterministic) {
  for (const Case& c : kCases) CheckBackward<bf16>(c);
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
