// The parts of engine/dist/collective.h every build has: one rank alone, and
// host:port parsing.
#include "engine/dist/collective.h"

#include <cstring>

namespace ft {
namespace {

class SingleRankCollective final : public Collective {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  Status AllReduceSum(float*, int64_t) override { return Status::OK(); }
  Status AllReduceSum(double*, int64_t) override { return Status::OK(); }
  Status AllReduceSum(int64_t*, int64_t) override { return Status::OK(); }
  Status AllReduceMax(int8_t*, int64_t) override { return Status::OK(); }
  Status Broadcast(void*, int64_t, int) override { return Status::OK(); }
  Status AllGather(const void* mine, int64_t bytes, void* out) override {
    if (bytes > 0 && out != mine) std::memmove(out, mine, static_cast<size_t>(bytes));
    return Status::OK();
  }
  Status Barrier(std::chrono::milliseconds) override { return Status::OK(); }
};

}  // namespace

std::unique_ptr<Collective> SingleRank() { return std::make_unique<SingleRankCollective>(); }

Status CheckRank(const RendezvousSpec& spec) {
  if (spec.world >= 1 && spec.rank >= 0 && spec.rank < spec.world) return Status::OK();
  return Status::InvalidArgument("rank " + std::to_string(spec.rank) + " of world " +
                                 std::to_string(spec.world) + ": need 0 <= rank < world");
}

Status ParseHostPort(const std::string& text, const std::string& what, std::string* host, int* port) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    return Status::InvalidArgument(what + ": '" + text + "' is not host:port (e.g. 10.0.0.5:29500)");
  }
  *host = text.substr(0, colon);
  const std::string digits = text.substr(colon + 1);
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 5 ||
      std::stoi(digits) <= 0 || std::stoi(digits) > 65535) {
    return Status::InvalidArgument(what + ": '" + digits + "' is not a port (1..65535)");
  }
  *port = std::stoi(digits);
  return Status::OK();
}

}  // namespace ft
