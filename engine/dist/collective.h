// Collectives across the ranks of one training job (multi-rank training,
// issue #14), on existing libraries: Gloo over TCP for CPU ranks
// (engine/dist/gloo_collective.cc), NCCL for CUDA ranks
// (engine/dist/nccl_collective.cc). Rendezvous: rank 0 hosts a key-value
// store (engine/dist/tcp_store.h) at the address every rank is given (ftd's,
// or the user's for a hand-launched job); the ranks exchange their Gloo
// addresses through it, under a name (job and attempt) so two attempts
// never meet.
//
// Every call is collective: each rank makes the same calls, in the same
// order, with the same sizes. Results are identical on every rank (Gloo's
// ring reduces each element in one order and sends the result around), so
// replicas that apply them stay bit-identical to each other. A failure (a
// peer gone, the timeout passed) is Unavailable naming the operation; the
// Collective is unusable after one.
//
// Thread safety: one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace ft {

struct RendezvousSpec {
  int rank = 0;
  int world = 1;
  std::string address;  // host:port where rank 0 serves the store (every rank connects there)
  std::string name;     // namespace of this attempt's keys (e.g. job id and epoch)
  // The address this rank's Gloo device listens on, as the other ranks reach
  // it ("" = the host name's address).
  std::string host;
  std::chrono::milliseconds timeout{60000};  // rendezvous and each collective
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // x[0..n) = the element-wise sum over the ranks' x.
  virtual Status AllReduceSum(float* x, int64_t n) = 0;
  virtual Status AllReduceSum(double* x, int64_t n) = 0;
  // Integer sums are exact, so their result does not depend on the order
  // the ranks' values meet in (the order-independent sums of
  // engine/dist/exact_sum.h are built on them).
  virtual Status AllReduceSum(int64_t* x, int64_t n) = 0;
  // x[0..n) = the element-wise maximum over the ranks' x.
  virtual Status AllReduceMax(int8_t* x, int64_t n) = 0;
  // data[0..bytes) = root's data[0..bytes) on every rank.
  virtual Status Broadcast(void* data, int64_t bytes, int root) = 0;
  // out[r·bytes .. (r+1)·bytes) = rank r's mine[0..bytes), on every rank
  // (out holds world·bytes; FSDP gathers its shards so).
  virtual Status AllGather(const void* mine, int64_t bytes, void* out) = 0;
  // Returns when every rank has called it. `timeout` > 0 replaces the
  // spec's for this call: how ranks wait out a phase only rank 0 works in
  // (checking outputs, writing a checkpoint).
  virtual Status Barrier(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) = 0;
};

// One rank alone: every collective returns its input (no store, no sockets).
std::unique_ptr<Collective> SingleRank();

// The ranks of `spec` connected over Gloo/TCP (rank 0 also serves the store).
// InvalidArgument for a bad rank/world/address; Unavailable when the ranks do
// not all arrive within the timeout.
StatusOr<std::unique_ptr<Collective>> ConnectGloo(const RendezvousSpec& spec);

// The ranks of `spec` connected over NCCL (CUDA ranks: one GPU each, the
// current device; engine/dist/nccl_collective.cc). Unimplemented in a build
// without NCCL; Unavailable without a visible GPU or when the ranks do not
// all arrive.
StatusOr<std::unique_ptr<Collective>> ConnectNccl(const RendezvousSpec& spec);

// What ConnectNccl does before it needs a GPU: the attempt's NCCL unique id (ncclUniqueId's bytes),
// made by rank 0 and published in the rendezvous store it serves (the one Gloo's ranks use), read
// there by every other rank; rank 0 returns once each has read it. Unimplemented in a build without
// NCCL (or, for world > 1, without Gloo's store); Unavailable when a rank does not arrive.
StatusOr<std::string> ExchangeNcclUniqueId(const RendezvousSpec& spec);

// InvalidArgument unless 0 <= spec.rank < spec.world.
Status CheckRank(const RendezvousSpec& spec);

// "host:port" split; InvalidArgument naming `what` otherwise.
Status ParseHostPort(const std::string& text, const std::string& what, std::string* host, int* port);

}  // namespace ft
