// cuDNN's fused SDPA route (kernels/cuda/attention_cudnn.h) against our CUDA
// kernels (cuda::AttentionForward/Backward) and the CPU reference in double,
// forward out and lse, backward dq, dk and dv: head dims 64, 128 and 256,
// causal rows and packed documents (segments), grouped-query heads, bf16
// storage and fp16; two backward runs must give the same bytes (the route is
// deterministic or refused); and calls the route must refuse (soft-cap,
// sliding window, a KV cache) are refused with the reason, by the route's
// choice (engine/model/attention_route.h) and by the kernel wrapper itself.
//
// Label gpu. Skips without a GPU (FT_REQUIRE_GPU=1 makes that a failure, as
// in every CUDA test) and when the route is unavailable here: a build
// without cuDNN's headers, no libcudnn.so.9 (FT_CUDNN_ROOT names the pip
// wheel's folder), a cuDNN older than the route takes, or a GPU other than
// Hopper; FT_REQUIRE_CUDNN=1 (bench/gpu/run.sh, where it found cuDNN) makes
// that a failure too, with the reason.
#include "kernels/cuda/attention_cudnn.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "engine/model/attention_route.h"
#include "tests/kernels/cuda/harness.h"

namespace ft::cuda::testing {
namespace {

struct Case {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
  int64_t max_doc = 0;  // packed documents of random lengths 1..max_doc; 0 = causal rows
};

std::string Name(const Case& c) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "b%ld T%ld H%ld/%ld d%ld docs<=%ld", static_cast<long>(c.batch),
                static_cast<long>(c.seq), static_cast<long>(c.q_heads), static_cast<long>(c.kv_heads),
                static_cast<long>(c.head_dim), static_cast<long>(c.max_doc));
  return buf;
}

// Rows that end mid-tile, GQA groups of 1, 2 and 4, documents short and long
// (one longer than 64, so cuDNN's padded sequence is past its minimum).
const Case kCases[] = {
    {2, 77, 4, 2, 64},       {1, 130, 4, 1, 128},     {2, 200, 4, 4, 256},      {2, 257, 4, 2, 64, 40},
    {1, 130, 2, 1, 128, 40}, {1, 200, 2, 1, 256, 40}, {2, 256, 4, 1, 128, 100},
};
const Case kFp16Cases[] = {{2, 77, 4, 2, 64}, {1, 200, 4, 2, 128, 40}};

// The route's facts for shape `s` on this device and library (the CudaBackend's, without documents).
AttentionRouteFacts Facts(const AttentionShape& s) {
  AttentionRouteFacts f;
  f.cudnn_version = CudnnAttention::LoadedVersion(&f.cudnn_missing);
  f.cudnn_loaded = f.cudnn_version > 0;
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  f.sm = major * 10 + minor;
  f.shape = s;
  f.documents = s.batch;
  f.max_doc_len = s.seq;
  return f;
}

bool Required(const char* var) {
  const char* v = std::getenv(var);
  return v != nullptr && std::string(v) == "1";
}

class CudnnAttentionTest : public CudaOpTest {
 protected:
  void SetUp() override {
    CudaOpTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    const AttentionShape plain{1, 64, 1, 1, 64, 0.125};
    const Status refusal = CudnnAttentionRefusal(Facts(plain));
    if (!refusal.ok()) {
      ASSERT_FALSE(Required("FT_REQUIRE_CUDNN")) << "FT_REQUIRE_CUDNN=1 but " << refusal.ToString();
      GTEST_SKIP() << "cuDNN's route is not available here: " << refusal.ToString()
                   << " (bench/gpu/run.sh runs it on an H100/H200 with the nvidia-cudnn wheel)";
    }
    auto created = CudnnAttention::Create();
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    cudnn_ = std::move(*created);
  }

  struct Inputs {
    AttentionShape s;
    std::vector<float> q, k, v, dout;
    std::vector<int32_t> segments;  // empty: causal rows
  };

  // Inputs rounded to T, so the double reference sees what the GPU does.
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
    if (c.max_doc > 0) {  // ids increasing within a row, each document 1..max_doc long
      in.segments.resize(rows);
      for (int64_t b = 0; b < c.batch; ++b) {
        int32_t id = 0;
        for (int64_t i = 0, left = 0; i < c.seq; ++i, --left) {
          if (left == 0) {
            left = RandomInt(1, static_cast<int>(c.max_doc));
            ++id;
          }
          in.segments[b * c.seq + i] = id;
        }
      }
    }
    return in;
  }
  static const int32_t* Segments(const Inputs& in) {
    return in.segments.empty() ? nullptr : in.segments.data();
  }

  // cuDNN's and our forward against the reference, and against each other.
  template <typename T>
  void CheckForward(const Case& c) {
    const Inputs in = MakeInputs<T>(c);
    const AttentionShape& s = in.s;
    DeviceBuffer<T> q(Encode<T>(in.q)), k(Encode<T>(in.k)), v(Encode<T>(in.v)), out(in.q.size()),
        ours(in.q.size());
    DeviceBuffer<int32_t> seg(in.segments.empty() ? std::vector<int32_t>{0} : in.segments);
    const int32_t* dseg = in.segments.empty() ? nullptr : seg.get();
    DeviceBuffer<float> lse(s.batch * s.q_heads * s.seq), ours_lse(lse.size());
    out.Poison();
    lse.Poison();
    auto docs = cudnn_->Prepare(s, dseg, stream_);
    ASSERT_TRUE(docs.ok()) << docs.status().ToString();
    FT_ASSERT_OK(cudnn_->Forward<T>(s, q.get(), k.get(), v.get(), out.get(), lse.get(), stream_));
    FT_ASSERT_OK(AttentionForward<T>(s, q.get(), k.get(), v.get(), dseg, ours.get(), ours_lse.get(), stream_,
                                     AttentionMath::kBf16));
    std::vector<double> ref_out(in.q.size()), ref_lse(lse.size());
    cpu::AttentionForwardNaive<double>(s, ToDouble(in.q).data(), ToDouble(in.k).data(), ToDouble(in.v).data(),
                                       Segments(in), ref_out.data(), ref_lse.data());
    const std::string name = Name(c) + " (" + std::to_string(docs->count) + " docs, cuDNN B" +
                             std::to_string(docs->batch) + " S" + std::to_string(docs->seq) + ")";
    const std::vector<float> got = out.DownloadFloat(), got_lse = lse.Download();
    EXPECT_TRUE(Close("cudnn out " + name, got, ref_out, kHalfBound));
    // lse: fp32 statistics of exact products of T values; cuDNN may fold the scale into exp2.
    EXPECT_TRUE(Close("cudnn lse " + name, got_lse, ref_lse, 1e-4));
    EXPECT_TRUE(Close("cudnn out vs ours " + name, got, ours.DownloadFloat(), 2 * kHalfBound));
    EXPECT_TRUE(Close("cudnn lse vs ours " + name, got_lse, ours_lse.Download(), 1e-4));
  }

  // The backward from the reference's out and lse: cuDNN against the
  // reference and ours, and a second cuDNN run byte for byte equal to the first.
  template <typename T>
  void CheckBackward(const Case& c) {
    const Inputs in = MakeInputs<T>(c);
    const AttentionShape& s = in.s;
    const std::vector<double> qd = ToDouble(in.q), kd = ToDouble(in.k), vd = ToDouble(in.v);
    std::vector<double> ref_out(in.q.size()), ref_lse(s.batch * s.q_heads * s.seq);
    cpu::AttentionForwardNaive<double>(s, qd.data(), kd.data(), vd.data(), Segments(in), ref_out.data(),
                                       ref_lse.data());
    const std::vector<float> out_t = RoundTo<T>(std::vector<float>(ref_out.begin(), ref_out.end()));
    const std::vector<float> lse_f(ref_lse.begin(), ref_lse.end());
    std::vector<double> ref[3] = {std::vector<double>(in.q.size()), std::vector<double>(in.k.size()),
                                  std::vector<double>(in.v.size())};
    cpu::AttentionBackward<double>(s, qd.data(), kd.data(), vd.data(), Segments(in), ToDouble(out_t).data(),
                                   ToDouble(lse_f).data(), ToDouble(in.dout).data(), ref[0].data(),
                                   ref[1].data(), ref[2].data());

    DeviceBuffer<T> q(Encode<T>(in.q)), k(Encode<T>(in.k)), v(Encode<T>(in.v)), out(Encode<T>(out_t));
    DeviceBuffer<float> lse(lse_f), dout(in.dout), ws(AttentionBackwardWorkspaceFloats(s));
    DeviceBuffer<int32_t> seg(in.segments.empty() ? std::vector<int32_t>{0} : in.segments);
    const int32_t* dseg = in.segments.empty() ? nullptr : seg.get();
    DeviceBuffer<float> g[3] = {DeviceBuffer<float>(in.q.size()), DeviceBuffer<float>(in.k.size()),
                                DeviceBuffer<float>(in.v.size())};
    DeviceBuffer<float> o[3] = {DeviceBuffer<float>(in.q.size()), DeviceBuffer<float>(in.k.size()),
                                DeviceBuffer<float>(in.v.size())};
    FT_ASSERT_OK((AttentionBackward<T, float>)(s, q.get(), k.get(), v.get(), dseg, out.get(), lse.get(),
                                               dout.get(), o[0].get(), o[1].get(), o[2].get(), ws.get(),
                                               stream_, AttentionMath::kBf16));
    const char* names[3] = {"dq", "dk", "dv"};
    std::vector<float> first[3];
    for (int run = 0; run < 2; ++run) {
      for (auto& b : g) b.Poison();
      ASSERT_TRUE(cudnn_->Prepare(s, dseg, stream_).ok());
      FT_ASSERT_OK(cudnn_->Backward<T>(s, q.get(), k.get(), v.get(), out.get(), lse.get(), dout.get(),
                                       g[0].get(), g[1].get(), g[2].get(), stream_));
      for (int i = 0; i < 3; ++i) {
        const std::vector<float> got = g[i].Download();
        if (run == 0) {
          EXPECT_TRUE(Close(std::string("cudnn ") + names[i] + " " + Name(c), got, ref[i], kHalfBound));
          EXPECT_TRUE(Close(std::string("cudnn ") + names[i] + " vs ours " + Name(c), got, o[i].Download(),
                            2 * kHalfBound));
          first[i] = got;
        } else {
          EXPECT_EQ(std::memcmp(got.data(), first[i].data(), got.size() * sizeof(float)), 0)
              << names[i] << " differs between two cuDNN backward runs: " << Name(c);
        }
      }
    }
  }

  std::unique_ptr<CudnnAttention> cudnn_;
};

TEST_F(CudnnAttentionTest, ForwardBf16MatchesCpuAndOurs) {
  for (const Case& c : kCases) CheckForward<bf16>(c);
}

TEST_F(CudnnAttentionTest, BackwardBf16MatchesCpuAndOursAndIsDeterministic) {
  for (const Case& c : kCases) CheckBackward<bf16>(c);
}

TEST_F(CudnnAttentionTest, Fp16MatchesCpuAndOurs) {
  for (const Case& c : kFp16Cases) {
    CheckForward<fp16>(c);
    CheckBackward<fp16>(c);
  }
}

// Packed rows: the documents Prepare finds, and cuDNN's batch and sequence rounded up.
TEST_F(CudnnAttentionTest, PrepareCountsDocumentsAndRoundsUp) {
  const AttentionShape s{2, 100, 2, 1, 64, 0.125};
  std::vector<int32_t> seg(200);
  for (int64_t t = 0; t < 200; ++t) seg[t] = t % 100 < 30 ? 1 : t % 100 < 95 ? 2 : 3;  // 30, 65, 5 per row
  DeviceBuffer<int32_t> dseg(seg);
  auto docs = cudnn_->Prepare(s, dseg.get(), stream_);
  ASSERT_TRUE(docs.ok()) << docs.status().ToString();
  EXPECT_EQ(docs->count, 6);
  EXPECT_EQ(docs->max_len, 65);
  EXPECT_EQ(docs->batch, 8);
  EXPECT_EQ(docs->seq, 100);  // 128, at most the row
  auto rows = cudnn_->Prepare(s, nullptr, stream_);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  EXPECT_EQ(rows->batch, 2);
  EXPECT_EQ(rows->seq, 100);
}

// What the route cannot express is refused with the reason: by the route's
// choice on this device's facts (what CudaBackend asks per call), and by the
// wrapper if called anyway.
TEST_F(CudnnAttentionTest, SoftcapWindowAndKvCacheAreRefusedWithTheReason) {
  AttentionShape capped{1, 64, 2, 1, 64, 0.125};
  capped.softcap = 50;
  AttentionShape windowed{1, 64, 2, 1, 64, 0.125};
  windowed.window = 16;
  AttentionShape cached{1, 4, 2, 1, 64, 0.125};
  cached.kv_seq = 64;
  const std::pair<AttentionShape, const char*> refused[] = {
      {capped, "soft-capped"}, {windowed, "sliding window"}, {cached, "KV cache"}};
  for (const auto& [s, words] : refused) {
    auto route = ChooseAttentionRoute(AttentionRouteRequest::kCudnn, Facts(s));
    ASSERT_FALSE(route.ok()) << words;
    EXPECT_EQ(route.status().code(), Status::Code::kUnimplemented) << route.status().ToString();
    EXPECT_NE(route.status().message().find(words), std::string::npos) << route.status().ToString();
    auto fallback = ChooseAttentionRoute(AttentionRouteRequest::kAuto, Facts(s));
    ASSERT_TRUE(fallback.ok());
    EXPECT_EQ(*fallback, AttentionRoute::kOurs);
    const Status direct = cudnn_->Prepare(s, nullptr, stream_).status();
    EXPECT_EQ(direct.code(), Status::Code::kUnimplemented) << direct.ToString();
    EXPECT_NE(direct.message().find(words), std::string::npos) << direct.ToString();
  }
}

}  // namespace
}  // namespace ft::cuda::testing
