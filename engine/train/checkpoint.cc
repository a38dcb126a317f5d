#include "engine/train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/confined_path.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "engine/io/safetensors.h"

namespace ft {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

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

// ".<kind>-step-N.e<epoch>.<pid>": a checkpoint's temporary (kind "tmp") or
// trash (kind "trash"), named by the process that made it.
std::string ScratchName(const std::string& kind, const std::string& name, int64_t epoch) {
  return "." + kind + "-" + name + ".e" + std::to_string(epoch) + "." + std::to_string(::getpid());
}

// A scratch directory's epoch and pid; false for other names. Names of older
// builds (".tmp-step-N.<pid>", ".old-…") read as epoch 0.
bool ParseScratchName(const std::string& name, int64_t* epoch, int64_t* pid) {
  if (name.rfind(".tmp-", 0) != 0 && name.rfind(".trash-", 0) != 0 && name.rfind(".old-", 0) != 0) {
    return false;
  }
  const size_t last = name.rfind('.');
  const size_t prev = last == 0 ? std::string::npos : name.rfind('.', last - 1);
  *pid = std::strtoll(name.c_str() + last + 1, nullptr, 10);
  *epoch = 0;
  if (prev != std::string::npos && prev > 0 && name.compare(prev, 2, ".e") == 0) {
    *epoch = std::strtoll(name.c_str() + prev + 2, nullptr, 10);
  }
  return true;
}

Status CheckFence(const Fence& fence) { return fence ? fence() : Status::OK(); }

// Renames `dir` to a trash name, then deletes it: at no point is there a
// step-* directory without its manifest.
Status RemoveCheckpointDir(const fs::path& dir, int64_t epoch) {
  const fs::path trash = dir.parent_path() / ScratchName("trash", dir.filename().string(), epoch);
  FT_RETURN_IF_ERROR(RenameDurably(dir.string(), trash.string()));
  if (Status s = RemoveAllConfined(trash.string()); !s.ok()) FT_LOG(WARN) << s.ToString();
  return Status::OK();
}

}  // namespace

Status WriteCheckpoint(const std::string& root, const CheckpointContents& c, const Fence& fence,
                       double* seconds) {
  const auto start = std::chrono::steady_clock::now();
  FT_RETURN_IF_ERROR(CheckFence(fence));
  FT_RETURN_IF_ERROR(CreateDirectoriesConfined(root).WithContext("the checkpoint directory"));
  const std::string name = CheckpointName(c.state.step);
  const fs::path final_dir = fs::path(root) / name;
  if (fs::exists(final_dir) && VerifyCheckpoint(final_dir.string()).ok()) {
    auto state = ReadCheckpointState(final_dir.string());
    if (state.ok() && state->job_hash == c.state.job_hash) {
      FT_LOG(INFO) << "checkpoint " << name << " already exists (epoch " << state->epoch << "): kept";
      if (seconds) *seconds = 0;
      return Status::OK();
    }
  }
  const fs::path tmp = fs::path(root) / ScratchName("tmp", name, c.state.epoch);
  FT_RETURN_IF_ERROR(RemoveAllConfined(tmp.string()));
  FT_RETURN_IF_ERROR(CreateDirectoriesConfined(tmp.string()));

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
  FT_RETURN_IF_ERROR(WriteFileDurably((tmp / "trainer_state.json").string(), TrainerStateToJson(c.state)));
  files.push_back("optimizer.safetensors");
  files.push_back("trainer_state.json");

  // The manifest is written last: its presence (verified) is what makes the directory a checkpoint.
  json manifest = {
      {"format", "ftune-checkpoint-manifest"}, {"version", kCheckpointFormatVersion}, {"step", c.state.step}};
  for (const std::string& f : files) {
    uint64_t size = 0;
    FT_ASSIGN_OR_RETURN(std::string sha, Sha256File((tmp / f).string(), &size));
    manifest["files"][f] = {{"bytes", size}, {"sha256", sha}};
  }
  FT_RETURN_IF_ERROR(WriteFileDurably((tmp / kCheckpointManifest).string(), manifest.dump(2) + "\n"));
  FT_RETURN_IF_ERROR(SyncDirectory(tmp.string()));

  if (Status owned = CheckFence(fence); !owned.ok()) {
    (void)RemoveAllConfined(tmp.string());  // our own temporary: nobody else's to clean up
    return owned;
  }
  if (fs::exists(final_dir)) {
    // A damaged step-N (or another job's): moved to the trash once the new one is complete.
    FT_RETURN_IF_ERROR(RemoveCheckpointDir(final_dir, c.state.epoch));
  }
  FT_RETURN_IF_ERROR(RenameDurably(tmp.string(), final_dir.string()));
  if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return Status::OK();
}

Status VerifyCheckpoint(const std::string& dir) {
  const std::string manifest_path = (fs::path(dir) / kCheckpointManifest).string();
  auto text = ReadFileToString(manifest_path, kMaxConfigFileBytes);
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
  FT_ASSIGN_OR_RETURN(c.state, TrainerStateFromJson(state_text, (d / "trainer_state.json").string()));
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

StatusOr<CheckpointEntry> FindNewestValidCheckpoint(const std::string& root,
                                                    std::vector<std::string>* skipped) {
  for (const CheckpointEntry& e : ListCheckpoints(root)) {
    Status s = VerifyCheckpoint(e.dir);
    if (s.ok()) return e;
    if (skipped) skipped->push_back(s.message());
  }
  return Status::NotFound(root + ": no valid checkpoint");
}

Status PruneCheckpoints(const std::string& root, const Retention& r) {
  std::error_code ec;
  int64_t kept = 0;
  const std::string committed = r.committed ? r.committed() : "";
  for (const CheckpointEntry& e : ListCheckpoints(root)) {
    const bool is_protected = std::find(r.protect.begin(), r.protect.end(), e.dir) != r.protect.end() ||
                              (!committed.empty() && fs::path(e.dir) == fs::path(committed));
    if (is_protected || kept < r.keep) {
      ++kept;
      continue;
    }
    if (r.epoch > 0 && CheckpointEpoch(e.dir) > r.epoch) continue;  // a newer owner's
    FT_RETURN_IF_ERROR(CheckFence(r.fence));
    FT_RETURN_IF_ERROR(RemoveCheckpointDir(e.dir, r.epoch));
  }
  // Scratch directories of killed or superseded processes (this epoch's other pids, older epochs).
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    int64_t epoch = 0, pid = 0;
    if (!ParseScratchName(name, &epoch, &pid)) continue;
    if (pid == ::getpid() || (r.epoch > 0 && epoch > r.epoch)) continue;
    FT_RETURN_IF_ERROR(CheckFence(r.fence));
    (void)RemoveAllConfined(e.path().string());
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

Status CheckpointWriter::Submit(CheckpointContents c, Retention r) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  Status previous = last_status_;
  job_ = std::move(c);
  retention_ = std::move(r);
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

void CheckpointWriter::Seed(double mean_seconds, const std::vector<double>& recent_fixed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (mean_seconds > 0) recent_seconds_.assign(kRecentWrites, mean_seconds);
  const size_t keep = std::min(recent_fixed.size(), kRecentWrites);
  recent_fixed_.assign(recent_fixed.end() - static_cast<ptrdiff_t>(keep), recent_fixed.end());
}

namespace {
double Mean(const std::deque<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
void PushRecent(std::deque<double>* v, double seconds) {
  v->push_back(seconds);
  if (v->size() > CheckpointWriter::kRecentWrites) v->pop_front();
}
}  // namespace

double CheckpointWriter::mean_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  return Mean(recent_seconds_);
}

std::vector<double> CheckpointWriter::recent_fixed() {
  std::lock_guard<std::mutex> lock(mu_);
  return {recent_fixed_.begin(), recent_fixed_.end()};
}

bool CheckpointWriter::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return !busy_;
}

void CheckpointWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return has_job_ || quit_; });
    if (quit_ && !has_job_) return;
    CheckpointContents job = std::move(job_);
    Retention retention = retention_;
    has_job_ = false;
    lock.unlock();
    double seconds = 0;
    Status s = WriteCheckpoint(root_, job, retention.fence, &seconds);
    if (s.ok()) {
      retention.protect.push_back((fs::path(root_) / CheckpointName(job.state.step)).string());
      s = PruneCheckpoints(root_, retention);
      FT_LOG(INFO) << "checkpoint " << CheckpointName(job.state.step) << " written in " << seconds << " s ("
                   << job.state.reason << ")";
    } else {
      FT_LOG(ERROR) << "checkpoint " << CheckpointName(job.state.step) << " failed: " << s.ToString();
    }
    lock.lock();
    last_status_ = s;
    if (s.ok()) {
      last_seconds_ = seconds;
      PushRecent(&recent_seconds_, seconds);
      if (job.state.back_to_back) PushRecent(&recent_fixed_, seconds);
      completed_.push_back({job.state.step, seconds, job.state.reason,
                            (fs::path(root_) / CheckpointName(job.state.step)).string(),
                            job.state.interval_seconds, job.state.mtbf_seconds, job.state.back_to_back});
    }
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace ft
