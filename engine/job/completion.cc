#include "engine/job/completion.h"

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace ft {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
constexpr const char* kFile = "COMPLETE.json";

std::string RecordPath(const std::string& output_dir) { return (fs::path(output_dir) / kFile).string(); }
}  // namespace

Status WriteCompletion(const std::string& output_dir, CompletionRecord record,
                       const std::vector<std::string>& output_dirs) {
  for (const std::string& sub : output_dirs) {
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(fs::path(output_dir) / sub, ec)) {
      if (!e.is_regular_file()) continue;
      uint64_t bytes = 0;
      FT_ASSIGN_OR_RETURN(std::string sha, Sha256File(e.path().string(), &bytes));
      record.files[fs::relative(e.path(), output_dir).string()] = {bytes, sha};
    }
    if (ec) return Status::IOError((fs::path(output_dir) / sub).string() + ": " + ec.message());
  }
  json j = {{"format", "ftune-complete"}, {"job_id", record.job_id}, {"job_hash", record.job_hash},
            {"epoch", record.epoch},      {"steps", record.steps},   {"files", json::object()}};
  for (const auto& [name, f] : record.files) j["files"][name] = {{"bytes", f.bytes}, {"sha256", f.sha256}};
  if (!record.stop_reason.empty()) j["stop_reason"] = record.stop_reason;
  if (record.adapter_step > 0) j["adapter_step"] = record.adapter_step;
  return ReplaceFileAtomically(RecordPath(output_dir), j.dump(2) + "\n");
}

StatusOr<CompletionRecord> ReadCompletion(const std::string& output_dir) {
  const std::string path = RecordPath(output_dir);
  auto text = ReadFileToString(path);
  if (!text.ok()) return Status::NotFound(path + ": no completion record");
  json j = json::parse(*text, nullptr, false);
  if (!j.is_object() || j.value("format", "") != "ftune-complete" || !j.contains("files") ||
      !j["files"].is_object()) {
    return Status::Corruption(path + ": not an ftune completion record");
  }
  CompletionRecord r;
  try {
    r.job_id = j.value("job_id", "");
    r.job_hash = j.at("job_hash").get<std::string>();
    r.epoch = j.value("epoch", int64_t{0});
    r.steps = j.at("steps").get<int64_t>();
    r.stop_reason = j.value("stop_reason", "");
    r.adapter_step = j.value("adapter_step", int64_t{0});
    for (auto it = j["files"].begin(); it != j["files"].end(); ++it) {
      r.files[it.key()] = {it->at("bytes").get<uint64_t>(), it->at("sha256").get<std::string>()};
    }
  } catch (const json::exception& e) {
    return Status::Corruption(path + ": " + e.what());
  }
  return r;
}

StatusOr<CompletionRecord> VerifyCompletion(const std::string& output_dir, const std::string& job_hash,
                                            bool checksums) {
  auto r = ReadCompletion(output_dir);
  if (!r.ok()) {
    if (r.status().IsNotFound()) return r.status();
    return Status::FailedPrecondition(r.status().message());
  }
  if (r->job_hash != job_hash) {
    return Status::FailedPrecondition(RecordPath(output_dir) + ": records job " + r->job_id +
                                      " with other training math (job_hash " + r->job_hash + ")");
  }
  if (r->files.empty()) return Status::FailedPrecondition(RecordPath(output_dir) + ": lists no output");
  for (const auto& [name, f] : r->files) {
    const std::string path = (fs::path(output_dir) / name).string();
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec || size != f.bytes) {
      return Status::FailedPrecondition(path + ": missing or not the size COMPLETE.json records");
    }
    if (checksums) {
      auto sha = Sha256File(path);
      if (!sha.ok() || *sha != f.sha256) {
        return Status::FailedPrecondition(path + ": SHA-256 differs from COMPLETE.json");
      }
    }
  }
  return r;
}

Status RemoveCompletion(const std::string& output_dir) {
  const std::string path = RecordPath(output_dir);
  if (!fs::exists(path)) return Status::OK();
  const std::string trash =
      (fs::path(output_dir) / (".trash-COMPLETE.json." + std::to_string(::getpid()))).string();
  FT_RETURN_IF_ERROR(RenameDurably(path, trash));
  std::error_code ec;
  fs::remove(trash, ec);
  return Status::OK();
}

}  // namespace ft
