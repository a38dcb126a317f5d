// Collectives over Gloo's TCP transport (engine/dist/collective.h).
#include <cstring>
#include <exception>
#include <string>

#include "engine/dist/collective.h"
#include "engine/dist/tcp_store.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"

namespace ft {
namespace {

class GlooCollective final : public Collective {
 public:
  GlooCollective(std::unique_ptr<TcpStoreServer> server, std::shared_ptr<gloo::Context> context)
      : server_(std::move(server)), context_(std::move(context)) {}

  int rank() const override { return context_->rank; }
  int world() const override { return context_->size; }

  Status AllReduceSum(float* x, int64_t n) override { return Reduce(x, n, "all-reduce (float)"); }
  Status AllReduceSum(double* x, int64_t n) override { return Reduce(x, n, "all-reduce (double)"); }
  Status AllReduceSum(int64_t* x, int64_t n) override { return Reduce(x, n, "all-reduce (int64)"); }
  Status AllReduceMax(int8_t* x, int64_t n) override {
    return Reduce(x, n, "all-reduce (int8 max)",
                  static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<int8_t>));
  }

  Status Broadcast(void* data, int64_t bytes, int root) override {
    return Run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setTag(NextTag());
      opts.setRoot(root);
      opts.setOutput(static_cast<char*>(data), static_cast<size_t>(bytes));
      gloo::broadcast(opts);
    });
  }

  Status AllGather(const void* mine, int64_t bytes, void* out) override {
    if (bytes == 0) return Status::OK();
    return Run("all-gather", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setTag(NextTag());
      // Gloo copies the input into the output's own slot first; its input is not written.
      opts.setInput(const_cast<char*>(static_cast<const char*>(mine)), static_cast<size_t>(bytes));
      opts.setOutput(static_cast<char*>(out), static_cast<size_t>(bytes * world()));
      gloo::allgather(opts);
    });
  }

  Status Barrier(std::chrono::milliseconds timeout) override {
    return Run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(NextTag());
      if (timeout.count() > 0) opts.setTimeout(timeout);
      gloo::barrier(opts);
    });
  }

 private:
  template <typename T>
  Status Reduce(T* x, int64_t n, const char* what,
                void (*reduce)(void*, const void*, const void*, size_t) = &gloo::sum<T>) {
    if (n == 0) return Status::OK();
    return Run(what, [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setTag(NextTag());
      opts.setOutput(x, static_cast<size_t>(n));
      opts.setReduceFunction(reduce);
      gloo::allreduce(opts);
    });
  }

  // Runs one Gloo operation; its exceptions (a peer gone, a timeout) become Unavailable.
  template <typename F>
  Status Run(const char* what, F&& op) {
    if (!failed_.ok()) return failed_;
    try {
      op();
      return Status::OK();
    } catch (const std::exception& e) {
      failed_ = Status::Unavailable(std::string(what) + " across " + std::to_string(world()) +
                                    " ranks (rank " + std::to_string(rank()) + "): " + e.what());
      return failed_;
    }
  }

  uint32_t NextTag() { return tag_++; }

  std::unique_ptr<TcpStoreServer> server_;  // rank 0: the store outlives the rendezvous
  std::shared_ptr<gloo::Context> context_;
  uint32_t tag_ = 1;
  Status failed_;
};

}  // namespace

StatusOr<std::unique_ptr<Collective>> ConnectGloo(const RendezvousSpec& spec) {
  FT_RETURN_IF_ERROR(CheckRank(spec));
  if (spec.world == 1) return SingleRank();
  FT_ASSIGN_OR_RETURN(StoreConnection connection, ConnectStore(spec));
  std::unique_ptr<TcpStoreServer>& server = connection.server;
  TcpStore* store = connection.store.get();
  try {
    gloo::transport::tcp::attr attr;
    if (!spec.host.empty()) attr.hostname = spec.host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(spec.rank, spec.world);
    context->setTimeout(spec.timeout);
    gloo::rendezvous::PrefixStore prefixed(spec.name.empty() ? "ftune" : spec.name, *store);
    context->connectFullMesh(prefixed, device);
    return std::unique_ptr<Collective>(
        std::make_unique<GlooCollective>(std::move(server), std::move(context)));
  } catch (const std::exception& e) {
    return Status::Unavailable("rendezvous of rank " + std::to_string(spec.rank) + " of " +
                               std::to_string(spec.world) + " at " + spec.address + ": " + e.what());
  }
}

}  // namespace ft
