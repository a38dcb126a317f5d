#include "engine/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "engine/file_util.h"
#include "engine/safetensors.h"

namespace ft {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kFormatVersion = 1;
constexpr const char* kManifest = "MANIFEST.json";

json StateToJson(const TrainerState& s) {
  return {{"format", "ftune-checkpoint"},
          {"version", kFormatVersion},
          {"step", s.step},
          {"cursor", s.cursor},
          {"tokens_seen", s.tokens_seen},
          {"plan", {{"micro_batch", s.micro_batch}, {"accumulation", s.accumulation}, {"world", s.world}}},
          {"loss_scale", s.loss_scale},
          {"job_hash", s.job_hash},
          {"job_math", s.job_math},
          {"last_checkpoint_seconds", s.last_checkpoint_seconds},
          {"reason", s.reason}};
}

StatusOr<TrainerState> StateFromJson(const std::string& text, const std::string& file) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "ftune-checkpoint") {
    return Status::Corruption(file + ": not an ftune trainer_state.json");
  }
  if (j.value("version", 0) != kFormatVersion) {
    return Status::InvalidArgument(
        file + ": checkpoint format version " + std::to_string(j.value("version", 0)) +
        " is not supported (this build reads " + std::to_string(kFormatVersion) + ")");
  }
  TrainerState s;
  try {
    s.step = j.at("step").get<int64_t>();
    s.cursor = j.at("cursor").get<int64_t>();
    s.tokens_seen = j.at("tokens_seen").get<int64_t>();
    s.micro_batch = j.at("plan").at("micro_batch").get<int64_t>();
    s.accumulation = j.at("plan").at("accumulation").get<int64_t>();
    s.world = j.at("plan").at("world").get<int64_t>();
    s.loss_scale = j.at("loss_scale").get<double>();
    s.job_hash = j.at("job_hash").get<std::string>();
    s.job_math = j.at("job_math").get<std::map<std::string, std::string>>();
    s.last_checkpoint_seconds = j.value("last_checkpoint_seconds", 0.0);
    s.reason = j.value("reason", "");
  } catch (const json::exception& e) {
    return Status::Corruption(file + ": " + e.what());
  }
  return s;
}

Status WriteTensors(const std::string& path, const std::vector<HostTensor>& tensors) {
  std::vector<TensorToWrite> out;
  for (const HostTensor& t : tensors) out.push_back({t.name, t.shape, t.data.data(), DType::kF32});
  return WriteSafetensors(path, std::move(out), {{"format", "pt"}}, /*sync=*/true);
}

StatusOr<std::vector<HostTensor>> ReadTensors(const std::string& path) {
  FT_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  std::vector<HostTensor> out;
  for (const TensorInfo& info : file->tensors()) {
    HostTensor t{info.name, info.shape, std::vector<float>(static_cast<size_t>(info.numel()))};
    FT_RETURN_IF_ERROR(file->ReadFloat(info.name, info.shape, t.data.data()));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

std::string CheckpointName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08" PRId64, step);
  return buf;
}

Status WriteCheckpoint(const std::string& root, const CheckpointContents& c, double* seconds) {
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return Status::IOError(root + ": cannot create checkpoint directory: " + ec.message());
  const std::string name = CheckpointName(c.state.step);
  const fs::path tmp = fs::path(root) / (".tmp-" + name + "." + std::to_string(::getpid()));
  const fs::path final_dir = fs::path(root) / name;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return Status::IOError(tmp.string() + ": cannot create: " + ec.message());

  std::vector<std::string> files;
  if (!c.adapter_config_json.empty()) {
    FT_RETURN_IF_ERROR(WriteFileDurably((tmp / "adapter_config.json").string(), c.adapter_config_json));
    FT_RETURN_IF_ERROR(WriteTensors((tmp / "adapter_model.safetensors").string(), c.model));
    files = {"adapter_config.json", "adapter_model.safetensors"};
  } else {
    FT_RETURN_IF_ERROR(WriteFileDurably((tmp / "config.json").string(), c.model_config_json));
    FT_RETURN_IF_ERROR(WriteTensors((tmp / "model.safetensors").string(), c.model));
    files = {"config.json", "model.safetensors"};
  }
  FT_RETURN_IF_ERROR(WriteTensors((tmp / "optimizer.safetensors").string(), c.optimizer));
  FT_RETURN_IF_ERROR(
      WriteFileDurably((tmp / "trainer_state.json").string(), StateToJson(c.state).dump(2) + "\n"));
  files.push_back("optimizer.safetensors");
  files.push_back("trainer_state.json");

  // The manifest is written last: its presence (verified) is what makes the directory a checkpoint.
  json manifest = {
      {"format", "ftune-checkpoint-manifest"}, {"version", kFormatVersion}, {"step", c.state.step}};
  for (const std::string& f : files) {
    uint64_t size = 0;
    FT_ASSIGN_OR_RETURN(std::string sha, Sha256File((tmp / f).string(), &size));
    manifest["files"][f] = {{"bytes", size}, {"sha256", sha}};
  }
  FT_RETURN_IF_ERROR(WriteFileDurably((tmp / kManifest).string(), manifest.dump(2) + "\n"));
  FT_RETURN_IF_ERROR(SyncDirectory(tmp.string()));

  if (fs::exists(final_dir)) {
    // A re-run of the same step (e.g. after a crash before pruning): swap atomically enough.
    const fs::path old = fs::path(root) / (".old-" + name + "." + std::to_string(::getpid()));
    FT_RETURN_IF_ERROR(RenameDurably(final_dir.string(), old.string()));
    FT_RETURN_IF_ERROR(RenameDurably(tmp.string(), final_dir.string()));
    fs::remove_all(old, ec);
  } else {
    FT_RETURN_IF_ERROR(RenameDurably(tmp.string(), final_dir.string()));
  }
  if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::OK();
}

Status VerifyCheckpoint(const std::string& dir) {
  const std::string manifest_path = (fs::path(dir) / kManifest).string();
  auto text = ReadFileToString(manifest_path);
  if (!text.ok()) return Status::Corruption(manifest_path + ": missing (checkpoint incomplete)");
  json m = json::parse(*text, nullptr, false);
  if (m.is_discarded() || !m.contains("files") || !m["files"].is_object()) {
    return Status::Corruption(manifest_path + ": unreadable manifest");
  }
  for (auto it = m["files"].begin(); it != m["files"].end(); ++it) {
    const std::string path = (fs::path(dir) / it.key()).string();
    uint64_t size = 0;
    auto sha = Sha256File(path, &size);
    if (!sha.ok()) return Status::Corruption(path + ": listed in the manifest but missing");
    const uint64_t want_size = it->value("bytes", uint64_t{0});
    if (size != want_size) {
      return Status::Corruption(path + ": " + std::to_string(size) + " bytes, manifest says " +
                                std::to_string(want_size) + " (truncated?)");
    }
    if (*sha != it->value("sha256", ""))
      return Status::Corruption(path + ": SHA-256 differs from the manifest");
  }
  return Status::OK();
}

StatusOr<CheckpointContents> ReadCheckpoint(const std::string& dir) {
  FT_RETURN_IF_ERROR(VerifyCheckpoint(dir));
  CheckpointContents c;
  const fs::path d(dir);
  FT_ASSIGN_OR_RETURN(std::string state_text, ReadFileToString((d / "trainer_state.json").string()));
  FT_ASSIGN_OR_RETURN(c.state, StateFromJson(state_text, (d / "trainer_state.json").string()));
  if (fs::exists(d / "adapter_model.safetensors")) {
    FT_ASSIGN_OR_RETURN(c.adapter_config_json, ReadFileToString((d / "adapter_config.json").string()));
    FT_ASSIGN_OR_RETURN(c.model, ReadTensors((d / "adapter_model.safetensors").string()));
  } else {
    FT_ASSIGN_OR_RETURN(c.model_config_json, ReadFileToString((d / "config.json").string()));
    FT_ASSIGN_OR_RETURN(c.model, ReadTensors((d / "model.safetensors").string()));
  }
  FT_ASSIGN_OR_RETURN(c.optimizer, ReadTensors((d / "optimizer.safetensors").string()));
  return c;
}

std::vector<CheckpointEntry> ListCheckpoints(const std::string& root) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step = 0;
    char tail = 0;
    if (!e.is_directory() || name.rfind("step-", 0) != 0) continue;
    if (std::sscanf(name.c_str(), "step-%" SCNd64 "%c", &step, &tail) != 1) continue;
    out.push_back({step, e.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  return out;
}

StatusOr<CheckpointEntry> FindNewestValidCheckpoint(const std::string& root,
                                                    std::vector<std::string>* skipped) {
  for (const CheckpointEntry& e : ListCheckpoints(root)) {
    Status s = VerifyCheckpoint(e.dir);
    if (s.ok()) return e;
    if (skipped) skipped->push_back(s.message());
  }
  return Status::NotFound(root + ": no valid checkpoint");
}

Status PruneCheckpoints(const std::string& root, int64_t keep, const std::string& protect) {
  std::error_code ec;
  std::vector<CheckpointEntry> all = ListCheckpoints(root);
  int64_t kept = 0;
  for (const CheckpointEntry& e : all) {
    if (e.dir == protect || kept < keep) {
      ++kept;
      continue;
    }
    fs::remove_all(e.dir, ec);
    if (ec) return Status::IOError(e.dir + ": cannot delete old checkpoint: " + ec.message());
  }
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const std::string mine = "." + std::to_string(::getpid());
    const bool temp = name.rfind(".tmp-", 0) == 0 || name.rfind(".old-", 0) == 0;
    if (temp &&
        (name.size() < mine.size() || name.compare(name.size() - mine.size(), mine.size(), mine) != 0)) {
      fs::remove_all(e.path(), ec);  // left by a killed process
    }
  }
  return Status::OK();
}

CheckpointWriter::CheckpointWriter(std::string root) : root_(std::move(root)), thread_([this] { Loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    quit_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Status CheckpointWriter::Submit(CheckpointContents c, int64_t keep) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  Status previous = last_status_;
  job_ = std::move(c);
  keep_ = keep;
  has_job_ = true;
  busy_ = true;
  cv_.notify_all();
  return previous;
}

Status CheckpointWriter::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  return last_status_;
}

std::vector<CheckpointWriter::Completed> CheckpointWriter::TakeCompleted() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Completed> out;
  out.swap(completed_);
  return out;
}

double CheckpointWriter::last_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return last_seconds_;
}

void CheckpointWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return has_job_ || quit_; });
    if (quit_ && !has_job_) return;
    CheckpointContents job = std::move(job_);
    const int64_t keep = keep_;
    has_job_ = false;
    lock.unlock();
    double seconds = 0;
    Status s = WriteCheckpoint(root_, job, &seconds);
    if (s.ok()) {
      s = PruneCheckpoints(root_, keep, (fs::path(root_) / CheckpointName(job.state.step)).string());
      FT_LOG(INFO) << "checkpoint " << CheckpointName(job.state.step) << " written in " << seconds << " s ("
                   << job.state.reason << ")";
    } else {
      FT_LOG(ERROR) << "checkpoint " << CheckpointName(job.state.step) << " failed: " << s.ToString();
    }
    lock.lock();
    last_status_ = s;
    if (s.ok()) {
      last_seconds_ = seconds;
      completed_.push_back({job.state.step, seconds, job.state.reason,
                            (fs::path(root_) / CheckpointName(job.state.step)).string()});
    }
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace ft
