#include "engine/train/output_owner.h"

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/file_util.h"
#include "common/logging.h"

namespace ft {

namespace fs = std::filesystem;

namespace {
constexpr const char* kTokenFile = "OWNER.json";

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}
}  // namespace

StatusOr<OwnerToken> ReadOwnerToken(const std::string& dir) {
  const std::string path = (fs::path(dir) / kTokenFile).string();
  auto text = ReadFileToString(path);
  if (!text.ok()) return Status::NotFound(path + ": no owner token");
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.contains("epoch") || !j["epoch"].is_number_integer()) {
    return Status::Corruption(path + ": unreadable owner token");
  }
  OwnerToken t;
  t.job_id = j.value("job_id", "");
  t.epoch = j["epoch"].get<int64_t>();
  t.pid = j.value("pid", int64_t{0});
  t.host = j.value("host", "");
  t.time_ms = j.value("time_ms", int64_t{0});
  return t;
}

OutputOwner::OutputOwner(std::string dir, std::string job_id, int64_t epoch)
    : dir_(std::move(dir)), job_id_(std::move(job_id)), epoch_(epoch) {}

Status OutputOwner::WriteToken() {
  const int64_t now = WallNowMs();
  nlohmann::json j = {{"job_id", job_id_},
                      {"epoch", epoch_},
                      {"pid", static_cast<int64_t>(::getpid())},
                      {"host", HostName()},
                      {"time_ms", now}};
  const fs::path tmp =
      fs::path(dir_) / (".OWNER.json.e" + std::to_string(epoch_) + "." + std::to_string(::getpid()));
  FT_RETURN_IF_ERROR(WriteFileDurably(tmp.string(), j.dump() + "\n"));
  return RenameDurably(tmp.string(), (fs::path(dir_) / kTokenFile).string());
}

Status OutputOwner::Superseded(const OwnerToken& t) const {
  return Status::Aborted(dir_ + " is owned by epoch " + std::to_string(t.epoch) + " of job " + t.job_id +
                         " (pid " + std::to_string(t.pid) + " on " + t.host + "): epoch " +
                         std::to_string(epoch_) + " is superseded");
}

Status OutputOwner::AnotherJobs(const OwnerToken& t) const {
  return Status::InvalidArgument(
      dir_ + ": output.dir belongs to job " + t.job_id + " (epoch " + std::to_string(t.epoch) + ", pid " +
      std::to_string(t.pid) + " on " + t.host + ", " + kTokenFile + "), not to job " + job_id_ +
      ": two jobs in one directory overwrite each other's checkpoints and outputs; choose another "
      "output.dir for job " +
      job_id_ + " (or, if job " + t.job_id + " is gone for good, delete " + dir_ + "/" + kTokenFile + ")");
}

Status OutputOwner::Claim() {
  if (!fenced()) return Status::OK();
  std::lock_guard<std::mutex> lock(mu_);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return Status::IOError(dir_ + ": cannot create output.dir: " + ec.message());
  auto current = ReadOwnerToken(dir_);
  if (current.ok() && current->job_id != job_id_) return AnotherJobs(*current);
  if (current.ok() && current->epoch > epoch_) return Superseded(*current);
  return WriteToken();
}

Status OutputOwner::Check() {
  if (!fenced()) return Status::OK();
  std::lock_guard<std::mutex> lock(mu_);
  auto current = ReadOwnerToken(dir_);
  if (current.ok() && current->job_id == job_id_ && current->epoch == epoch_) return Status::OK();
  if (current.ok() && (current->job_id != job_id_ || current->epoch > epoch_)) return Superseded(*current);
  // Missing, damaged, or an older epoch's claim that raced ours: ours again.
  FT_LOG(WARN) << dir_ << ": owner token "
               << (current.ok() ? "of older epoch " + std::to_string(current->epoch)
                                : current.status().ToString())
               << "; claiming it again for epoch " << epoch_;
  return WriteToken();
}

}  // namespace ft
