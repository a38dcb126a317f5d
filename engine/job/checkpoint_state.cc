#include "engine/job/checkpoint_state.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/file_util.h"

namespace ft {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json EvalProgressToJson(const EvalProgress& e) {
  return {{"metric", e.metric},
          {"last_step", e.last_step},
          {"best_step", e.best_step},
          {"best_value", e.best_value},
          {"since_improvement", e.since_improvement},
          {"stop_reason", e.stop_reason}};
}

EvalProgress EvalProgressFromJson(const json& j) {
  EvalProgress e;
  if (!j.is_object()) return e;
  e.metric = j.value("metric", "");
  e.last_step = j.value("last_step", int64_t{0});
  e.best_step = j.value("best_step", int64_t{0});
  e.best_value = j.value("best_value", 0.0);
  e.since_improvement = j.value("since_improvement", int64_t{0});
  e.stop_reason = j.value("stop_reason", "");
  return e;
}

}  // namespace

std::string TrainerStateToJson(const TrainerState& s) {
  json j = {{"format", "ftune-checkpoint"},
            {"version", kCheckpointFormatVersion},
            {"step", s.step},
            {"cursor", s.cursor},
            {"source_positions", s.source_positions},
            {"tokens_seen", s.tokens_seen},
            {"plan", {{"micro_batch", s.micro_batch}, {"accumulation", s.accumulation}, {"world", s.world}}},
            {"loss_scale", s.loss_scale},
            {"loss_scale_growth_tracker", s.loss_scale_growth_tracker},
            {"skipped_steps", s.skipped_steps},
            {"job_hash", s.job_hash},
            {"job_math", s.job_math},
            {"inputs", s.inputs},
            {"last_checkpoint_seconds", s.last_checkpoint_seconds},
            {"mean_checkpoint_seconds", s.mean_checkpoint_seconds},
            {"fixed_checkpoint_seconds", s.fixed_checkpoint_seconds},
            {"recent_fixed_seconds", s.recent_fixed_seconds},
            {"checkpoints_since_probe", s.checkpoints_since_probe},
            {"back_to_back", s.back_to_back},
            {"reason", s.reason},
            {"interval_seconds", s.interval_seconds},
            {"mtbf_seconds", s.mtbf_seconds},
            {"epoch", s.epoch}};
  if (!s.evaluation.metric.empty()) j["evaluation"] = EvalProgressToJson(s.evaluation);
  return j.dump(2) + "\n";
}

StatusOr<TrainerState> TrainerStateFromJson(const std::string& text, const std::string& file) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != "ftune-checkpoint") {
    return Status::Corruption(file + ": not an ftune trainer_state.json");
  }
  if (j.value("version", 0) != kCheckpointFormatVersion) {
    return Status::InvalidArgument(
        file + ": checkpoint format version " + std::to_string(j.value("version", 0)) +
        " is not supported (this build reads " + std::to_string(kCheckpointFormatVersion) + ")");
  }
  TrainerState s;
  try {
    s.step = j.at("step").get<int64_t>();
    s.cursor = j.at("cursor").get<int64_t>();
    s.source_positions = j.value("source_positions", std::vector<int64_t>{});
    s.tokens_seen = j.at("tokens_seen").get<int64_t>();
    s.micro_batch = j.at("plan").at("micro_batch").get<int64_t>();
    s.accumulation = j.at("plan").at("accumulation").get<int64_t>();
    s.world = j.at("plan").at("world").get<int64_t>();
    s.loss_scale = j.at("loss_scale").get<double>();
    s.loss_scale_growth_tracker = j.value("loss_scale_growth_tracker", int64_t{0});
    s.skipped_steps = j.value("skipped_steps", int64_t{0});
    s.job_hash = j.at("job_hash").get<std::string>();
    s.job_math = j.at("job_math").get<std::map<std::string, std::string>>();
    s.inputs = j.value("inputs", std::map<std::string, std::string>{});
    s.last_checkpoint_seconds = j.value("last_checkpoint_seconds", 0.0);
    s.mean_checkpoint_seconds = j.value("mean_checkpoint_seconds", 0.0);
    s.fixed_checkpoint_seconds = j.value("fixed_checkpoint_seconds", 0.0);
    s.recent_fixed_seconds = j.value("recent_fixed_seconds", std::vector<double>{});
    if (!j.contains("recent_fixed_seconds") && s.fixed_checkpoint_seconds > 0) {
      s.recent_fixed_seconds = {s.fixed_checkpoint_seconds};  // written before the writes were kept
    }
    s.checkpoints_since_probe = j.value("checkpoints_since_probe", int64_t{0});
    s.back_to_back = j.value("back_to_back", false);
    s.reason = j.value("reason", "");
    s.interval_seconds = j.value("interval_seconds", 0.0);
    s.mtbf_seconds = j.value("mtbf_seconds", 0.0);
    s.epoch = j.value("epoch", int64_t{0});
    if (j.contains("evaluation")) s.evaluation = EvalProgressFromJson(j["evaluation"]);
  } catch (const json::exception& e) {
    return Status::Corruption(file + ": " + e.what());
  }
  return s;
}

std::string CheckpointName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08" PRId64, step);
  return buf;
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

StatusOr<TrainerState> ReadCheckpointState(const std::string& dir) {
  if (!fs::exists(fs::path(dir) / kCheckpointManifest)) {
    return Status::Corruption((fs::path(dir) / kCheckpointManifest).string() +
                              ": missing (checkpoint incomplete)");
  }
  const std::string file = (fs::path(dir) / "trainer_state.json").string();
  FT_ASSIGN_OR_RETURN(std::string text, ReadFileToString(file, kMaxConfigFileBytes));
  return TrainerStateFromJson(text, file);
}

int64_t CheckpointEpoch(const std::string& dir) {
  auto state = ReadCheckpointState(dir);
  return state.ok() ? state->epoch : -1;
}

StatusOr<CheckpointEntry> BestCheckpoint(const std::string& root, TrainerState* state) {
  for (const CheckpointEntry& newest : ListCheckpoints(root)) {
    auto recorded = ReadCheckpointState(newest.dir);
    if (!recorded.ok()) continue;  // damaged or incomplete: the one before says
    const int64_t best = recorded->evaluation.best_step;
    if (best <= 0) break;
    const std::string dir = (fs::path(root) / CheckpointName(best)).string();
    auto best_state = ReadCheckpointState(dir);
    if (!best_state.ok()) break;
    if (state) *state = *best_state;
    return CheckpointEntry{best, dir};
  }
  return Status::NotFound(root + ": no best checkpoint (checkpoint.keep_best)");
}

}  // namespace ft
