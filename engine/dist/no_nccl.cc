// ConnectNccl and ExchangeNcclUniqueId in a build without CUDA or without NCCL: said plainly.
#include "engine/dist/collective.h"

namespace ft {

StatusOr<std::unique_ptr<Collective>> ConnectNccl(const RendezvousSpec&) {
  return Status::Unimplemented(
      "this build has no NCCL (it needs the CUDA toolkit with nccl.h and libnccl); use --dist-backend gloo");
}

StatusOr<std::string> ExchangeNcclUniqueId(const RendezvousSpec&) {
  return Status::Unimplemented("this build has no NCCL (it needs the CUDA toolkit with nccl.h and libnccl)");
}

}  // namespace ft
