// A full fine-tune's DPO reference log-probabilities (engine/train/reference_logprobs.h).
#include "engine/train/reference_logprobs.h"

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/logging.h"

namespace ft {

namespace {

constexpr char kFormat[] = "ftune DPO reference log-probabilities";
constexpr int kVersion = 1;
constexpr uint64_t kMaxFileBytes = uint64_t{1} << 32;

}  // namespace

std::string ReferenceLogProbs::PathFor(const std::string& data_path, const std::string& key) {
  return data_path + ".ftref-" + Sha256Hex(key).substr(0, 16);
}

std::string ReferenceLogProbs::Serialize(const std::string& key) const {
  nlohmann::ordered_json j = {{"format", kFormat}, {"version", kVersion}, {"key", key}, {"rows", rows()}};
  nlohmann::ordered_json sums = nlohmann::ordered_json::array(), tokens = nlohmann::ordered_json::array();
  for (const SequenceLogProb& v : values_) {
    sums.push_back(v.sum);  // dumped with enough digits to read back the same double
    tokens.push_back(v.tokens);
  }
  j["sums"] = std::move(sums);
  j["tokens"] = std::move(tokens);
  std::string out = j.dump() + "\n";
  return out + Sha256Hex(out) + "\n";
}

// NotFound: no file, or one for another key or data size (then recomputed quietly); Corruption:
// a file whose checksum or contents do not hold.
Status ReferenceLogProbs::Load(const std::string& key, int64_t rows) {
  StatusOr<std::string> text = ReadFileToString(path_, kMaxFileBytes);
  if (!text.ok()) return Status::NotFound(text.status().message());
  const size_t body_end = text->rfind('\n', text->size() >= 2 ? text->size() - 2 : 0);
  if (body_end == std::string::npos || text->size() != body_end + 1 + 64 + 1 ||
      Sha256Hex(text->substr(0, body_end + 1)) != text->substr(body_end + 1, 64)) {
    return Status::Corruption("its checksum does not match its contents");
  }
  const auto j = nlohmann::json::parse(text->substr(0, body_end), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("format", "") != kFormat || j.value("version", 0) != kVersion)
    return Status::Corruption("not a version " + std::to_string(kVersion) + " reference file");
  if (j.value("key", "") != key || j.value("rows", int64_t{-1}) != rows)
    return Status::NotFound("made for other data or another model");
  const auto& sums = j["sums"];
  const auto& tokens = j["tokens"];
  const size_t n = static_cast<size_t>(2 * rows);
  if (!sums.is_array() || !tokens.is_array() || sums.size() != n || tokens.size() != n)
    return Status::Corruption("it holds " + std::to_string(sums.size()) + " values for " +
                              std::to_string(rows) + " pairs");
  values_.assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    if (!sums[i].is_number() || !tokens[i].is_number_integer() || tokens[i].get<int64_t>() < 0)
      return Status::Corruption("value " + std::to_string(i) + " is not a log-probability and a count");
    values_[i] = {sums[i].get<double>(), tokens[i].get<int64_t>()};
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<ReferenceLogProbs>> ReferenceLogProbs::LoadOrCompute(
    Model& model, const Dataset& data, const std::string& data_path, const std::string& key, bool keep,
    const std::function<bool()>& stop_requested) {
  std::unique_ptr<ReferenceLogProbs> ref(new ReferenceLogProbs());
  ref->path_ = PathFor(data_path, key);
  const Status loaded = ref->Load(key, data.size());
  if (loaded.ok()) {
    ref->from_file_ = true;
    FT_LOG(INFO) << "DPO reference: " << data.size() << " pairs' log-probabilities read from " << ref->path_;
    return ref;
  }
  if (loaded.code() == Status::Code::kCorruption) {
    FT_LOG(ERROR) << "DAMAGED DPO REFERENCE " << ref->path_ << " (" << loaded.message()
                  << "): recomputing it";
    std::fprintf(stderr, "ft-train: WARNING: damaged DPO reference %s (%s): recomputed\n", ref->path_.c_str(),
                 std::string(loaded.message()).c_str());
  }
  const auto start = std::chrono::steady_clock::now();
  ref->values_.clear();
  ref->values_.reserve(static_cast<size_t>(2 * data.size()));
  for (int64_t row = 0; row < data.size(); ++row) {
    if (stop_requested && stop_requested())
      return Status::Cancelled("stopped while computing the DPO reference's log-probabilities");
    FT_ASSIGN_OR_RETURN(const MicroBatch mb, data.MakeBatch(row, 1, /*shuffle=*/false, 0));
    const std::vector<SequenceLogProb> pair = model.SequenceLogProbs(mb);
    ref->values_.insert(ref->values_.end(), pair.begin(), pair.end());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  FT_LOG(INFO) << "DPO reference: " << data.size() << " pairs' log-probabilities computed in " << seconds
               << " s" << (keep ? "; kept in " + ref->path_ : std::string());
  if (!keep) return ref;
  const Status saved = ReplaceFileAtomically(ref->path_, ref->Serialize(key));
  if (!saved.ok())
    FT_LOG(WARN) << "cannot keep the DPO reference (a resume recomputes it): " << saved.ToString();
  return ref;
}

}  // namespace ft
