// The ranks of one multi-rank job as threads of a test process, connected
// over Gloo on loopback (rank 0 serves the rendezvous store), as separate
// processes would be. Header-only: for tests that link ft_engine_dist.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/dist/collective.h"
#include "tests/support/free_port.h"

namespace ft::testing_support {

inline RendezvousSpec LoopbackSpec(int rank, int world, int port, int timeout_ms = 20000) {
  RendezvousSpec s;
  s.rank = rank;
  s.world = world;
  s.address = "127.0.0.1:" + std::to_string(port);
  s.host = "127.0.0.1";
  s.name = "test";
  s.timeout = std::chrono::milliseconds(timeout_ms);
  return s;
}

// Runs body(rank, collective) on `world` connected ranks, one thread each
// (world 1: the single rank, no sockets).
inline void OnLoopbackRanks(int world, const std::function<void(int, Collective&)>& body) {
  const int port = FreeLoopbackPort();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto c = ConnectGloo(LoopbackSpec(r, world, port));
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      EXPECT_EQ((*c)->rank(), r);
      EXPECT_EQ((*c)->world(), world);
      body(r, **c);
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace ft::testing_support
