// engine/model/attention_route.h: the attention route as data. Every refusal
// of cuDNN's route has a case and its message; an explicit `cudnn` is never
// replaced by ours; `auto` is ours until a GPU is in the measured table.
#include "engine/model/attention_route.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace ft {
namespace {

// An H200 with cuDNN 9.19 and a Llama-3-8B-like bf16 layer: a call the route takes.
AttentionRouteFacts Taken() {
  AttentionRouteFacts f;
  f.cudnn_loaded = true;
  f.cudnn_version = 91900;
  f.sm = 90;
  f.gpu = "NVIDIA H200";
  f.shape.batch = 1;
  f.shape.seq = 2048;
  f.shape.q_heads = 32;
  f.shape.kv_heads = 8;
  f.shape.head_dim = 128;
  f.shape.scale = 1 / std::sqrt(128.0);
  f.documents = 1;
  f.max_doc_len = 2048;
  return f;
}

// The refusal's message for a request of cudnn, or "" when taken.
std::string CudnnRefusal(const AttentionRouteFacts& f) {
  auto route = ChooseAttentionRoute(AttentionRouteRequest::kCudnn, f);
  if (route.ok()) {
    EXPECT_EQ(*route, AttentionRoute::kCudnn);
    return "";
  }
  EXPECT_EQ(route.status().message().rfind("train.attention: cudnn (train.attention: flash runs ours): ", 0),
            0u)
      << route.status().ToString();
  return route.status().message();
}

void ExpectRefused(const AttentionRouteFacts& f, const std::string& words) {
  const std::string message = CudnnRefusal(f);
  EXPECT_NE(message.find(words), std::string::npos) << "message: '" << message << "', want '" << words << "'";
  // auto never fails: it runs ours where cuDNN refuses.
  auto route = ChooseAttentionRoute(AttentionRouteRequest::kAuto, f);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(*route, AttentionRoute::kOurs);
}

TEST(AttentionRouteTest, CudnnTakesCausalGqaHeadDims64To256) {
  for (int64_t hd : {64, 128, 256}) {
    AttentionRouteFacts f = Taken();
    f.shape.head_dim = hd;
    EXPECT_EQ(CudnnRefusal(f), "") << hd;
  }
  AttentionRouteFacts f16 = Taken();
  f16.storage = AttentionStorage::kF16;
  EXPECT_EQ(CudnnRefusal(f16), "");
}

TEST(AttentionRouteTest, CudnnTakesPackedDocuments) {
  AttentionRouteFacts f = Taken();
  f.segments = true;
  f.shape.batch = 4;
  f.documents = 16;  // 16 documents of at most 512 tokens in 4 rows
  f.max_doc_len = 512;
  EXPECT_EQ(CudnnRefusal(f), "");
}

TEST(AttentionRouteTest, OursIsOursWhateverTheFacts) {
  AttentionRouteFacts f;  // nothing loaded, nothing known
  auto route = ChooseAttentionRoute(AttentionRouteRequest::kOurs, f);
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(*route, AttentionRoute::kOurs);
}

TEST(AttentionRouteTest, AutoIsOursUntilMeasured) {
  // No GPU is in the measured table yet: auto runs ours even where cuDNN would take the call.
  EXPECT_FALSE(CudnnMeasuredFaster("NVIDIA H200"));
  auto route = ChooseAttentionRoute(AttentionRouteRequest::kAuto, Taken());
  ASSERT_TRUE(route.ok());
  EXPECT_EQ(*route, AttentionRoute::kOurs);
}

TEST(AttentionRouteTest, RefusesWithoutTheLibrary) {
  AttentionRouteFacts f = Taken();
  f.cudnn_loaded = false;
  f.cudnn_missing = "dlopen libcudnn.so.9: not found";
  ExpectRefused(f, "cuDNN is not available: dlopen libcudnn.so.9: not found");
}

TEST(AttentionRouteTest, RefusesOldAndKnownBadVersions) {
  AttentionRouteFacts f = Taken();
  f.cudnn_version = 90500;
  ExpectRefused(f, "cuDNN 9.5.0 is loaded; the route needs 9.x from 9.6.0");
  f.cudnn_version = 100000;
  ExpectRefused(f, "cuDNN 10.0.0 is loaded");
  f.cudnn_version = 91001;
  ExpectRefused(f, "cuDNN 9.10.1 has known bf16/fp16 SDPA bugs");
}

TEST(AttentionRouteTest, RefusesGpusWithoutADeterministicBackward) {
  AttentionRouteFacts f = Taken();
  f.sm = 80;
  ExpectRefused(f, "deterministic SDPA backward is built here for Hopper (sm_90) only; this GPU is sm_80");
  f.sm = 100;
  ExpectRefused(f, "this GPU is sm_100");
}

TEST(AttentionRouteTest, RefusesFp32Storage) {
  AttentionRouteFacts f = Taken();
  f.storage = AttentionStorage::kF32;
  ExpectRefused(f, "takes bf16 or fp16 tensors; this model stores fp32");
}

TEST(AttentionRouteTest, RefusesOtherHeadDims) {
  AttentionRouteFacts f = Taken();
  f.shape.head_dim = 96;
  ExpectRefused(f, "built for head dims 64, 128 and 256, not 96");
}

TEST(AttentionRouteTest, RefusesSoftCappedScores) {
  AttentionRouteFacts f = Taken();
  f.shape.softcap = 50;
  ExpectRefused(f, "takes no soft-capped scores");
}

TEST(AttentionRouteTest, RefusesSlidingWindows) {
  AttentionRouteFacts f = Taken();
  f.shape.window = 4096;
  ExpectRefused(f, "does not express sliding windows (window 4096)");
}

TEST(AttentionRouteTest, RefusesAKvCache) {
  AttentionRouteFacts f = Taken();
  f.shape.kv_seq = 2048 + 16;
  ExpectRefused(f, "no KV cache (16 cached keys)");
}

TEST(AttentionRouteTest, RefusesTensorsPastInt32Offsets) {
  AttentionRouteFacts f = Taken();
  f.shape.batch = 256;
  f.shape.seq = 8192;
  f.documents = 256;
  f.max_doc_len = 64;  // keeps the scratch small: the offsets alone refuse
  ExpectRefused(f, "ragged offsets are int32");
}

TEST(AttentionRouteTest, RefusesADeterministicScratchOverBudget) {
  AttentionRouteFacts f = Taken();
  f.segments = true;
  f.shape.batch = 8;
  f.documents = 64;  // one long document makes every document's padded square 2048^2
  f.max_doc_len = 2048;
  // 64 x 32 x 2048^2 x 2 bytes = 16 GiB.
  EXPECT_EQ(CudnnDeterministicWorkspaceBytes(f), int64_t{16} << 30);
  ExpectRefused(f,
                "needs 16.0 GiB of dP scratch (64 documents x 32 heads x 2048^2 x 2 bytes), over its 2.0 GiB "
                "budget; use a smaller micro-batch or fewer, more even documents per row");
  f.workspace_budget_bytes = int64_t{16} << 30;
  EXPECT_EQ(CudnnRefusal(f), "");
}

}  // namespace
}  // namespace ft
