#include "engine/job/metrics_line.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

namespace ft {

namespace {

using Kind = MetricsLine::Kind;
using nlohmann::json;

// When an optional key is written (and so may be missing when read).
enum class When { kAlways, kPositive, kMultiRank, kSharded, kFp16 };

// Every number a line carries: the one list the writer and the parser share.
// A number that is NaN is written as null and read back as NaN.
struct NumberKey {
  std::string_view key;
  Kind kind;
  double MetricsLine::*real = nullptr;
  int64_t MetricsLine::*integer = nullptr;
  When when = When::kAlways;
};
constexpr NumberKey kMetricsKeys[] = {
    {"loss", Kind::kStep, &MetricsLine::loss},
    {"lr", Kind::kStep, &MetricsLine::lr},
    {"grad_norm", Kind::kStep, &MetricsLine::grad_norm},
    {"tokens", Kind::kStep, nullptr, &MetricsLine::tokens},
    {"tokens_seen", Kind::kStep, nullptr, &MetricsLine::tokens_seen},
    {"tokens_per_s", Kind::kStep, &MetricsLine::tokens_per_s},
    {"step_seconds", Kind::kStep, &MetricsLine::step_seconds},
    {"time_ms", Kind::kStep, nullptr, &MetricsLine::time_ms, When::kPositive},
    {"copy_wait_seconds", Kind::kStep, &MetricsLine::copy_wait_seconds},
    {"peak_bytes", Kind::kStep, nullptr, &MetricsLine::peak_bytes},
    {"checkpoint_seconds", Kind::kStep, &MetricsLine::checkpoint_seconds, nullptr, When::kPositive},
    {"world", Kind::kStep, nullptr, &MetricsLine::world, When::kMultiRank},
    {"allreduce_seconds", Kind::kStep, &MetricsLine::allreduce_seconds, nullptr, When::kMultiRank},
    {"gather_seconds", Kind::kStep, &MetricsLine::gather_seconds, nullptr, When::kSharded},
    {"loss_scale", Kind::kStep, &MetricsLine::loss_scale, nullptr, When::kFp16},
    {"eval_loss", Kind::kEval, &MetricsLine::eval_loss},
    {"eval_tokens", Kind::kEval, nullptr, &MetricsLine::eval_tokens},
    {"eval_seconds", Kind::kEval, &MetricsLine::eval_seconds},
    {"checkpoint_seconds", Kind::kCheckpoint, &MetricsLine::checkpoint_seconds},
    {"interval_seconds", Kind::kCheckpoint, &MetricsLine::interval_seconds, nullptr, When::kPositive},
    {"mtbf_seconds", Kind::kCheckpoint, &MetricsLine::mtbf_seconds, nullptr, When::kPositive},
    {"interval_seconds", Kind::kInterval, &MetricsLine::interval_seconds},
    {"checkpoint_seconds", Kind::kInterval, &MetricsLine::checkpoint_seconds},
    {"mtbf_seconds", Kind::kInterval, &MetricsLine::mtbf_seconds},
};
constexpr const char* kPeakByCategory = "peak_bytes_by_category";  // step: {category: bytes}
constexpr const char* kSkipped = "skipped";                        // step, fp16: a bool
constexpr const char* kBackToBack = "back_to_back";                // checkpoint: true when so

// The text fields of event lines: {event name, kind, key of `reason`, whether "dir" is written}.
struct EventKey {
  std::string_view event;
  Kind kind;
  std::string_view reason_key;  // "" = none
  bool dir = false;
  bool resume_kind = false;  // "kind"
};
constexpr EventKey kEvents[] = {
    {"checkpoint", Kind::kCheckpoint, "reason", true},
    {"preempted", Kind::kPreempted, "reason"},
    {"failed", Kind::kFailed, "reason"},
    {"resume", Kind::kResume, "note", true, true},
    {"interval", Kind::kInterval, "why"},
    {"early_stop", Kind::kEarlyStop, "reason"},
};

bool Written(const NumberKey& k, const MetricsLine& m) {
  switch (k.when) {
    case When::kAlways: return true;
    case When::kPositive: return k.real != nullptr ? m.*k.real > 0 : m.*k.integer > 0;
    case When::kMultiRank: return m.world > 1;
    case When::kSharded: return m.world > 1 && m.sharded;
    case When::kFp16: return m.fp16;
  }
  return true;
}

const EventKey* EventOf(Kind kind) {
  for (const EventKey& e : kEvents)
    if (e.kind == kind) return &e;
  return nullptr;
}

double Number(const json& j, std::string_view key) {
  auto it = j.find(key);
  if (it != j.end() && it->is_null()) return std::numeric_limits<double>::quiet_NaN();
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

std::string Text(const json& j, std::string_view key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

MetricsLine MetricsEvent(MetricsLine::Kind kind, int64_t step, std::string reason) {
  MetricsLine m;
  m.kind = kind;
  m.step = step;
  m.reason = std::move(reason);
  return m;
}

std::string FormatMetricsLine(const MetricsLine& m) {
  json j = {{"step", m.step}};
  if (const EventKey* e = EventOf(m.kind)) {
    j["event"] = e->event;
    if (!e->reason_key.empty()) j[std::string(e->reason_key)] = m.reason;
    if (e->dir) j["dir"] = m.dir;
    if (e->resume_kind) j["kind"] = m.resume_kind;
  }
  for (const NumberKey& k : kMetricsKeys) {
    if (k.kind != m.kind || !Written(k, m)) continue;
    json& v = j[std::string(k.key)];
    if (k.integer != nullptr) {
      v = m.*k.integer;
    } else if (std::isfinite(m.*k.real)) {
      v = m.*k.real;
    }  // else null: JSON has no NaN or inf
  }
  if (m.kind == Kind::kStep) {
    j[kPeakByCategory] = m.peak_bytes_by_category;
    if (m.fp16) j[kSkipped] = m.skipped;
  }
  if (m.kind == Kind::kStep || m.kind == Kind::kEval) {
    for (const auto& [name, value] : m.objective_metrics)
      j[name] = std::isfinite(value) ? json(value) : json(nullptr);
  }
  if (m.kind == Kind::kCheckpoint && m.back_to_back) j[kBackToBack] = true;
  if (m.epoch > 0) j["epoch"] = m.epoch;
  return j.dump();
}

StatusOr<MetricsLine> ParseMetricsLine(std::string_view line) {
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::InvalidArgument("metrics line is not a JSON object");
  auto step = j.find("step");
  if (step == j.end() || !step->is_number_integer()) {
    return Status::InvalidArgument("metrics line has no integer \"step\"");
  }
  MetricsLine m;
  m.step = step->get<int64_t>();
  m.epoch = static_cast<int64_t>(Number(j, "epoch"));
  if (j.contains("event")) {
    m.kind = Kind::kOtherEvent;
    const std::string event = Text(j, "event");
    for (const EventKey& e : kEvents) {
      if (e.event != event) continue;
      m.kind = e.kind;
      if (!e.reason_key.empty()) m.reason = Text(j, e.reason_key);
      if (e.dir) m.dir = Text(j, "dir");
      if (e.resume_kind) m.resume_kind = Text(j, "kind");
    }
  } else {
    m.kind = j.contains("eval_loss") ? Kind::kEval : Kind::kStep;
  }
  for (const NumberKey& k : kMetricsKeys) {
    if (k.kind != m.kind) continue;
    if (k.integer != nullptr) {
      const double v = Number(j, k.key);
      m.*k.integer = std::isfinite(v) ? static_cast<int64_t>(v) : 0;
    } else {
      m.*k.real = Number(j, k.key);
    }
  }
  if (m.kind == Kind::kCheckpoint) {
    auto b = j.find(kBackToBack);
    m.back_to_back = b != j.end() && b->is_boolean() && b->get<bool>();
  }
  if (m.kind == Kind::kStep) {
    m.sharded = j.contains("gather_seconds");
    m.fp16 = j.contains("loss_scale");
    auto skipped = j.find(kSkipped);
    m.skipped = skipped != j.end() && skipped->is_boolean() && skipped->get<bool>();
    auto peaks = j.find(kPeakByCategory);
    if (peaks != j.end() && peaks->is_object()) {
      for (const auto& [name, bytes] : peaks->items()) {
        if (bytes.is_number_integer()) m.peak_bytes_by_category[name] = bytes.get<int64_t>();
      }
    }
  }
  if (m.kind == Kind::kStep || m.kind == Kind::kEval) {
    for (const auto& [name, value] : j.items()) {
      if (name.find('/') != std::string::npos && value.is_number())
        m.objective_metrics[name] = value.get<double>();
    }
  }
  return m;
}

}  // namespace ft
