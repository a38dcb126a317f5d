// ConnectGloo in a build without Gloo (a GPU machine's engine-only build, which
// carries no Debian libgloo): one rank only, said plainly.
#include "engine/dist/collective.h"

namespace ft {

StatusOr<std::unique_ptr<Collective>> ConnectGloo(const RendezvousSpec& spec) {
  if (spec.world == 1 && spec.rank == 0) return SingleRank();
  return Status::Unimplemented(
      "multi-rank training needs Gloo, and this build has none (install libgloo-dev: "
      "deploy/install-deps.sh, and rebuild); run with one rank");
}

}  // namespace ft
