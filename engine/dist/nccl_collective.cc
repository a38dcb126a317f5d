// Collectives over NCCL for CUDA ranks (engine/dist/collective.h), one rank
// per GPU (the current CUDA device: ft-worker sets CUDA_VISIBLE_DEVICES).
//
// The interface takes host memory (what the trainer hands every backend), so
// each call copies into a device scratch buffer, runs the NCCL collective on
// a stream of its own and copies back: NCCL's transport (NVLink, PCIe,
// InfiniBand) between GPUs, at the price of two host copies per call.
// Rendezvous: rank 0 makes the NCCL unique id and publishes it in the same
// store the Gloo ranks use (rank 0 serves it; engine/dist/tcp_store.h), under
// the attempt's name; one rank alone needs no store. A build without Gloo
// (a GPU machine's engine-only build) connects one rank only.
//
// Failures (a peer gone, a CUDA error) are Unavailable naming the operation;
// the Collective is unusable after one. NCCL has no per-call timeout: a rank
// that vanishes mid-collective is noticed by its node's lease (ftd stops the
// gang), not here.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <vector>

#include "engine/dist/collective.h"
#ifdef FT_DIST_HAVE_GLOO
#include "engine/dist/tcp_store.h"
#endif

namespace ft {
namespace {

Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::OK();
  return Status::Unavailable(what + ": " + cudaGetErrorString(e));
}

Status NcclStatus(ncclResult_t r, const std::string& what) {
  if (r == ncclSuccess) return Status::OK();
  return Status::Unavailable(what + ": " + ncclGetErrorString(r));
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(ncclComm_t comm, cudaStream_t stream, int rank, int world)
      : comm_(comm), stream_(stream), rank_(rank), world_(world) {}
  ~NcclCollective() override {
    if (scratch_ != nullptr) cudaFree(scratch_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }

  Status AllReduceSum(float* x, int64_t n) override {
    return InPlace(x, n * static_cast<int64_t>(sizeof(float)), "all-reduce (float)", [&](void* d) {
      return ncclAllReduce(d, d, static_cast<size_t>(n), ncclFloat, ncclSum, comm_, stream_);
    });
  }
  Status AllReduceSum(double* x, int64_t n) override {
    return InPlace(x, n * static_cast<int64_t>(sizeof(double)), "all-reduce (double)", [&](void* d) {
      return ncclAllReduce(d, d, static_cast<size_t>(n), ncclDouble, ncclSum, comm_, stream_);
    });
  }
  Status AllReduceSum(int64_t* x, int64_t n) override {
    return InPlace(x, n * static_cast<int64_t>(sizeof(int64_t)), "all-reduce (int64)", [&](void* d) {
      return ncclAllReduce(d, d, static_cast<size_t>(n), ncclInt64, ncclSum, comm_, stream_);
    });
  }
  Status AllReduceMax(int8_t* x, int64_t n) override {
    return InPlace(x, n, "all-reduce (int8 max)", [&](void* d) {
      return ncclAllReduce(d, d, static_cast<size_t>(n), ncclInt8, ncclMax, comm_, stream_);
    });
  }
  Status Broadcast(void* data, int64_t bytes, int root) override {
    return InPlace(data, bytes, "broadcast", [&](void* d) {
      return ncclBroadcast(d, d, static_cast<size_t>(bytes), ncclChar, root, comm_, stream_);
    });
  }
  Status AllGather(const void* mine, int64_t bytes, void* out) override {
    if (bytes == 0) return Status::OK();
    if (!failed_.ok()) return failed_;
    const int64_t total = bytes * world_;
    char* d = nullptr;
    FT_RETURN_IF_ERROR(Fail(Scratch(total, &d)));
    char* slot = d + rank_ * bytes;  // NCCL's in-place all-gather: this rank's part at its slot
    FT_RETURN_IF_ERROR(Fail(
        CudaStatus(cudaMemcpyAsync(slot, mine, bytes, cudaMemcpyHostToDevice, stream_), "all-gather copy")));
    FT_RETURN_IF_ERROR(Fail(NcclStatus(
        ncclAllGather(slot, d, static_cast<size_t>(bytes), ncclChar, comm_, stream_), "all-gather")));
    FT_RETURN_IF_ERROR(
        Fail(CudaStatus(cudaMemcpyAsync(out, d, total, cudaMemcpyDeviceToHost, stream_), "all-gather copy")));
    return Fail(CudaStatus(cudaStreamSynchronize(stream_), "all-gather"));
  }
  Status Barrier(std::chrono::milliseconds) override {
    float one = 1;
    return AllReduceSum(&one, 1);
  }

 private:
  // Host data → device scratch, `op` on it in place, → host.
  template <typename Op>
  Status InPlace(void* host, int64_t bytes, const char* what, Op op) {
    if (bytes == 0) return Status::OK();
    if (!failed_.ok()) return failed_;
    char* d = nullptr;
    FT_RETURN_IF_ERROR(Fail(Scratch(bytes, &d)));
    FT_RETURN_IF_ERROR(Fail(
        CudaStatus(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, stream_), std::string(what))));
    FT_RETURN_IF_ERROR(
        Fail(NcclStatus(op(d), std::string(what) + " across " + std::to_string(world_) + " ranks")));
    FT_RETURN_IF_ERROR(Fail(
        CudaStatus(cudaMemcpyAsync(host, d, bytes, cudaMemcpyDeviceToHost, stream_), std::string(what))));
    return Fail(CudaStatus(cudaStreamSynchronize(stream_), std::string(what)));
  }

  Status Scratch(int64_t bytes, char** out) {
    if (bytes > scratch_bytes_) {
      if (scratch_ != nullptr) cudaFree(scratch_);
      scratch_ = nullptr;
      scratch_bytes_ = 0;
      FT_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&scratch_, static_cast<size_t>(bytes)), "collective scratch"));
      scratch_bytes_ = bytes;
    }
    *out = static_cast<char*>(scratch_);
    return Status::OK();
  }

  Status Fail(Status s) {
    if (!s.ok() && failed_.ok()) failed_ = s;
    return s;
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_, world_;
  void* scratch_ = nullptr;
  int64_t scratch_bytes_ = 0;
  Status failed_;
};

// The NCCL unique id of the attempt: made by rank 0, read by the others from rank 0's store.
StatusOr<ncclUniqueId> ExchangeId(const RendezvousSpec& spec) {
  ncclUniqueId id;
  if (spec.world == 1) {
    FT_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "NCCL unique id"));
    return id;
  }
#ifdef FT_DIST_HAVE_GLOO
  FT_ASSIGN_OR_RETURN(StoreConnection connection, ConnectStore(spec));
  TcpStore* store = connection.store.get();
  const std::string key = (spec.name.empty() ? std::string("ftune") : spec.name) + "/nccl-id";
  try {
    if (spec.rank == 0) {
      FT_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "NCCL unique id"));
      const char* bytes = reinterpret_cast<const char*>(&id);
      store->set(key, std::vector<char>(bytes, bytes + sizeof(id)));
      // The store lives as long as this call: wait until every other rank has read the id.
      std::vector<std::string> marks;
      for (int r = 1; r < spec.world; ++r) marks.push_back(key + "/read-" + std::to_string(r));
      store->wait(marks, spec.timeout);
    } else {
      store->wait({key}, spec.timeout);
      const std::vector<char> bytes = store->get(key);
      if (bytes.size() != sizeof(id)) return Status::Unavailable("rendezvous: a malformed NCCL id");
      std::memcpy(&id, bytes.data(), sizeof(id));
      store->set(key + "/read-" + std::to_string(spec.rank), {1});
    }
  } catch (const std::exception& e) {
    return Status::Unavailable("rendezvous of rank " + std::to_string(spec.rank) + " at " + spec.address +
                               ": " + e.what());
  }
  return id;
#else
  return Status::Unimplemented(
      "NCCL across several ranks needs the rendezvous store, which needs Gloo "
      "(libgloo-dev); this build has none");
#endif
}

}  // namespace

StatusOr<std::string> ExchangeNcclUniqueId(const RendezvousSpec& spec) {
  FT_RETURN_IF_ERROR(CheckRank(spec));
  FT_ASSIGN_OR_RETURN(ncclUniqueId id, ExchangeId(spec));
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

StatusOr<std::unique_ptr<Collective>> ConnectNccl(const RendezvousSpec& spec) {
  FT_RETURN_IF_ERROR(CheckRank(spec));
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return Status::Unavailable("NCCL needs a CUDA device; none is visible");
  }
  FT_ASSIGN_OR_RETURN(ncclUniqueId id, ExchangeId(spec));
  cudaStream_t stream = nullptr;
  FT_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "NCCL stream"));
  ncclComm_t comm = nullptr;
  if (Status s = NcclStatus(ncclCommInitRank(&comm, spec.world, id, spec.rank),
                            "NCCL communicator of rank " + std::to_string(spec.rank));
      !s.ok()) {
    cudaStreamDestroy(stream);
    return s;
  }
  return std::unique_ptr<Collective>(std::make_unique<NcclCollective>(comm, stream, spec.rank, spec.world));
}

}  // namespace ft
