// Collectives over Gloo on loopback: each rank a thread with its own
// connection (the store served by rank 0), as separate processes would be.
#include "engine/dist/collective.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "tests/support/loopback_ranks.h"

namespace ft {
namespace {

using ::testing::HasSubstr;

int FreePort() { return testing_support::FreeLoopbackPort(); }

RendezvousSpec Spec(int rank, int world, int port, int timeout_ms = 20000) {
  return testing_support::LoopbackSpec(rank, world, port, timeout_ms);
}

void OnRanks(int world, const std::function<void(int, Collective&)>& body) {
  testing_support::OnLoopbackRanks(world, body);
}

TEST(CollectiveTest, AllReduceSumsAndEveryRankGetsTheSameBits) {
  for (int world : {1, 2, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    std::vector<std::vector<float>> results(world);
    OnRanks(world, [&](int r, Collective& c) {
      // 1000003 floats: several of Gloo's segments, not a multiple of the world.
      std::vector<float> x(1000003);
      for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(r + 1) + 1e-3f * (i % 97);
      ASSERT_TRUE(c.AllReduceSum(x.data(), static_cast<int64_t>(x.size())).ok());
      std::vector<double> d = {1.5 * (r + 1), -2.0};
      ASSERT_TRUE(c.AllReduceSum(d.data(), 2).ok());
      EXPECT_EQ(d[0], 1.5 * world * (world + 1) / 2);
      EXPECT_EQ(d[1], -2.0 * world);
      // Integers (exact sums) and int8 maxima: past 2^53, where a double sum would round.
      std::vector<int64_t> i = {(int64_t{1} << 60) + r, -r};
      ASSERT_TRUE(c.AllReduceSum(i.data(), 2).ok());
      EXPECT_EQ(i[0], world * (int64_t{1} << 60) + world * (world - 1) / 2);
      EXPECT_EQ(i[1], -world * (world - 1) / 2);
      std::vector<int8_t> m = {static_cast<int8_t>(r), static_cast<int8_t>(-1 - r), 127};
      ASSERT_TRUE(c.AllReduceMax(m.data(), 3).ok());
      EXPECT_EQ(m[0], world - 1);
      EXPECT_EQ(m[1], -1);
      EXPECT_EQ(m[2], 127);
      results[r] = std::move(x);
    });
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(results[r].size(), results[0].size());
      EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), results[0].size() * sizeof(float)), 0)
          << "rank " << r << " differs from rank 0";
    }
    double expect = 0;
    for (int r = 0; r < world; ++r) expect += 0.1f * static_cast<float>(r + 1) + 1e-3f * (5 % 97);
    EXPECT_NEAR(results[0][5], expect, 1e-5);
  }
}

TEST(CollectiveTest, BroadcastAndBarrier) {
  OnRanks(3, [&](int r, Collective& c) {
    char text[16] = {};
    if (r == 1) std::snprintf(text, sizeof(text), "from one");
    ASSERT_TRUE(c.Broadcast(text, sizeof(text), 1).ok());
    EXPECT_STREQ(text, "from one");
    EXPECT_TRUE(c.Barrier().ok());
  });
}

// A phase only one rank works in outlasts the per-collective timeout: a
// barrier with its own, longer timeout waits it out.
TEST(CollectiveTest, AllGatherPutsEveryRanksBytesInRankOrder) {
  for (int world : {1, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    OnRanks(world, [&](int r, Collective& c) {
      std::vector<char> mine(1001, static_cast<char>('a' + r));  // not a multiple of anything
      std::vector<char> all(mine.size() * world, 0);
      ASSERT_TRUE(c.AllGather(mine.data(), static_cast<int64_t>(mine.size()), all.data()).ok());
      for (int from = 0; from < world; ++from) {
        EXPECT_EQ(all[from * mine.size()], 'a' + from);
        EXPECT_EQ(all[(from + 1) * mine.size() - 1], 'a' + from);
      }
    });
  }
}

TEST(CollectiveTest, ABarrierWithItsOwnTimeoutOutlastsTheDefault) {
  const int port = FreePort();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto c = ConnectGloo(Spec(r, 2, port, /*timeout_ms=*/500));
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // rank 0 alone works
      EXPECT_TRUE((*c)->Barrier(std::chrono::seconds(20)).ok());
      float x = 1;
      EXPECT_TRUE((*c)->AllReduceSum(&x, 1).ok());
      EXPECT_EQ(x, 2);
    });
  }
  for (std::thread& t : threads) t.join();
  // Without it, the default timeout fails the waiting rank.
  const int port2 = FreePort();
  Status waited;
  std::thread slow([&] {
    auto c = ConnectGloo(Spec(0, 2, port2, 500));
    ASSERT_TRUE(c.ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    (void)(*c)->Barrier();
  });
  auto c = ConnectGloo(Spec(1, 2, port2, 500));
  ASSERT_TRUE(c.ok());
  waited = (*c)->Barrier();
  slow.join();
  EXPECT_EQ(waited.code(), Status::Code::kUnavailable) << waited.ToString();
}

TEST(CollectiveTest, AMissingRankIsATimeoutNotAHang) {
  const int port = FreePort();
  // Rank 1 of 2 never comes: rank 0 gives up within its timeout, saying so.
  const auto start = std::chrono::steady_clock::now();
  auto c = ConnectGloo(Spec(0, 2, port, 1500));
  EXPECT_EQ(c.status().code(), Status::Code::kUnavailable);
  EXPECT_THAT(c.status().message(), HasSubstr("rendezvous of rank 0 of 2"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // A rank whose rank 0 never listens fails to connect, naming the address.
  auto lone = ConnectGloo(Spec(1, 2, FreePort(), 500));
  EXPECT_EQ(lone.status().code(), Status::Code::kUnavailable);
  EXPECT_THAT(lone.status().message(), HasSubstr("is rank 0 running?"));
}

TEST(CollectiveTest, BadSpecsAreRefusedByName) {
  EXPECT_TRUE(ConnectGloo(Spec(2, 2, 1234)).status().IsInvalidArgument());
  RendezvousSpec s = Spec(0, 2, 1);
  s.address = "no-port";
  auto c = ConnectGloo(s);
  EXPECT_TRUE(c.status().IsInvalidArgument());
  EXPECT_THAT(c.status().message(), HasSubstr("rendezvous address: 'no-port' is not host:port"));
  auto one = ConnectGloo(Spec(0, 1, 1));  // one rank: nothing to connect
  ASSERT_TRUE(one.ok());
  float x = 3;
  EXPECT_TRUE((*one)->AllReduceSum(&x, 1).ok());
  EXPECT_EQ(x, 3);
}

// Three ranks (threads) of one attempt get the same unique id, rank 0's, through its rendezvous
// store: what ft-train's NCCL ranks do before they need a GPU, so it runs on any machine whose build
// has NCCL (a build without it skips, saying so). Not in nccl_test.cc: ctest marks a gpu test
// skipped as a whole when any case skips, which would hide this one's failure.
TEST(CollectiveTest, EveryNcclRankGetsRankZerosUniqueIdThroughTheRendezvous) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);  // NCCL's bootstrap address: loopback is enough here
  const int port = testing_support::FreeLoopbackPort();
  constexpr int kWorld = 3;
  std::vector<StatusOr<std::string>> ids(kWorld, Status::Unavailable("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      ids[static_cast<size_t>(r)] = ExchangeNcclUniqueId(testing_support::LoopbackSpec(r, kWorld, port));
    });
  }
  for (std::thread& t : ranks) t.join();
  if (ids[0].status().code() == Status::Code::kUnimplemented) GTEST_SKIP() << ids[0].status().ToString();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(ids[static_cast<size_t>(r)].ok())
        << "rank " << r << ": " << ids[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(*ids[static_cast<size_t>(r)], *ids[0]) << "rank " << r;
  }
  EXPECT_EQ(ids[0]->size(), 128u) << "ncclUniqueId's bytes";
  EXPECT_NE(*ids[0], std::string(128, '\0'));
}

}  // namespace
}  // namespace ft
