#include "worker/metrics_line.h"

#include <limits>
#include <nlohmann/json.hpp>

namespace ft::worker {

namespace {

double Number(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string Text(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

MetricsLine::Kind EventKind(const std::string& event) {
  if (event == "checkpoint") return MetricsLine::Kind::kCheckpoint;
  if (event == "preempted") return MetricsLine::Kind::kPreempted;
  if (event == "failed") return MetricsLine::Kind::kFailed;
  if (event == "resume") return MetricsLine::Kind::kResume;
  return MetricsLine::Kind::kOtherEvent;
}

}  // namespace

StatusOr<MetricsLine> ParseMetricsLine(std::string_view line) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::InvalidArgument("metrics line is not a JSON object");
  auto step = j.find("step");
  if (step == j.end() || !step->is_number_integer()) {
    return Status::InvalidArgument("metrics line has no integer \"step\"");
  }
  MetricsLine m;
  m.step = step->get<int64_t>();
  m.epoch = static_cast<int64_t>(Number(j, "epoch"));
  if (j.contains("event")) {
    m.kind = EventKind(Text(j, "event"));
    m.dir = Text(j, "dir");
    m.reason = m.kind == MetricsLine::Kind::kResume ? Text(j, "note") : Text(j, "reason");
    m.resume_kind = Text(j, "kind");
    m.checkpoint_seconds = Number(j, "checkpoint_seconds");
    return m;
  }
  if (auto eval = j.find("eval_loss"); eval != j.end()) {
    m.kind = MetricsLine::Kind::kEval;
    m.eval_loss = eval->is_number() ? eval->get<double>() : std::numeric_limits<double>::quiet_NaN();
    m.eval_tokens = static_cast<int64_t>(Number(j, "eval_tokens"));
    return m;
  }
  m.kind = MetricsLine::Kind::kStep;
  m.loss = Number(j, "loss");
  m.lr = Number(j, "lr");
  // null: the step was skipped for an fp16 overflow (the norm was not finite).
  const auto norm = j.find("grad_norm");
  m.grad_norm =
      norm != j.end() && norm->is_null() ? std::numeric_limits<double>::quiet_NaN() : Number(j, "grad_norm");
  m.tokens = static_cast<int64_t>(Number(j, "tokens"));
  m.tokens_seen = static_cast<int64_t>(Number(j, "tokens_seen"));
  m.tokens_per_s = Number(j, "tokens_per_s");
  m.step_seconds = Number(j, "step_seconds");
  m.copy_wait_seconds = Number(j, "copy_wait_seconds");
  m.peak_bytes = static_cast<int64_t>(Number(j, "peak_bytes"));
  m.checkpoint_seconds = Number(j, "checkpoint_seconds");
  return m;
}

}  // namespace ft::worker
