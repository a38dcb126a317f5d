// The NCCL collective with one rank on one GPU (label gpu: skips without a
// GPU, or in a build without NCCL; FT_REQUIRE_GPU=1 makes a missing GPU a
// failure): every operation of engine/dist/collective.h through NCCL and
// back to host memory. (The exchange of NCCL's unique id, which needs no GPU,
// is checked on every machine in collective_test.cc.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/dist/collective.h"

namespace ft {
namespace {

TEST(NcclTest, OneRankRunsEveryCollective) {
  RendezvousSpec spec;
  spec.name = "nccl-test";
  auto c = ConnectNccl(spec);
  if (!c.ok()) {
    const char* require = std::getenv("FT_REQUIRE_GPU");
    if (require != nullptr && std::string(require) == "1") FAIL() << c.status().ToString();
    GTEST_SKIP() << c.status().ToString() << " (this test runs on a GPU machine: bench/gpu/run.sh)";
  }
  Collective& nccl = **c;
  EXPECT_EQ(nccl.rank(), 0);
  EXPECT_EQ(nccl.world(), 1);
  std::vector<float> x(100003);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.5f * static_cast<float>(i % 13);
  const std::vector<float> before = x;
  ASSERT_TRUE(nccl.AllReduceSum(x.data(), static_cast<int64_t>(x.size())).ok());
  EXPECT_EQ(x, before) << "one rank's sum is its own";
  double d[2] = {1.25, -3.5};
  ASSERT_TRUE(nccl.AllReduceSum(d, 2).ok());
  EXPECT_EQ(d[0], 1.25);
  EXPECT_EQ(d[1], -3.5);
  int64_t i[2] = {(int64_t{1} << 60) + 1, -7};
  ASSERT_TRUE(nccl.AllReduceSum(i, 2).ok());
  EXPECT_EQ(i[0], (int64_t{1} << 60) + 1);
  EXPECT_EQ(i[1], -7);
  int8_t m[2] = {-1, 127};
  ASSERT_TRUE(nccl.AllReduceMax(m, 2).ok());
  EXPECT_EQ(m[0], -1);
  EXPECT_EQ(m[1], 127);
  char text[8] = "nccl";
  ASSERT_TRUE(nccl.Broadcast(text, sizeof(text), 0).ok());
  EXPECT_STREQ(text, "nccl");
  std::vector<char> mine(777, 'q'), all(777, 0);
  ASSERT_TRUE(nccl.AllGather(mine.data(), 777, all.data()).ok());
  EXPECT_EQ(all, mine);
  EXPECT_TRUE(nccl.Barrier().ok());
}

}  // namespace
}  // namespace ft
