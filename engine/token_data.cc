#include "engine/token_data.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "engine/rng.h"

namespace ft {

namespace {

StatusOr<std::vector<int32_t>> ReadIds(const nlohmann::json& j, const char* key, const std::string& where,
                                       int64_t vocab_size, bool allow_ignore) {
  if (!j[key].is_array())
    return Status::InvalidArgument(where + ": '" + key + "' must be an array of integers");
  std::vector<int32_t> out;
  out.reserve(j[key].size());
  for (const auto& v : j[key]) {
    if (!v.is_number_integer())
      return Status::InvalidArgument(where + ": '" + key + "' must hold integers only");
    int64_t id = v.get<int64_t>();
    if ((id < 0 || id >= vocab_size) && !(allow_ignore && id == -100)) {
      return Status::InvalidArgument(where + ": " + key + " value " + std::to_string(id) +
                                     " is outside [0, " + std::to_string(vocab_size) +
                                     ") of the model's vocabulary");
    }
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

}  // namespace

StatusOr<TokenDataset> TokenDataset::Load(const std::string& path, int64_t vocab_size, int64_t seq_len) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(path + ": cannot open training data");
  TokenDataset ds;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(where + ": not a JSON object");
    if (!j.contains("input_ids")) {
      return Status::InvalidArgument(where +
                                     ": missing 'input_ids' (format: tokens expects {\"input_ids\": [...]})");
    }
    TokenSequence seq;
    FT_ASSIGN_OR_RETURN(seq.ids, ReadIds(j, "input_ids", where, vocab_size, false));
    if (j.contains("labels")) {
      FT_ASSIGN_OR_RETURN(seq.labels, ReadIds(j, "labels", where, vocab_size, true));
      if (seq.labels.size() != seq.ids.size()) {
        return Status::InvalidArgument(where + ": 'labels' has " + std::to_string(seq.labels.size()) +
                                       " entries but 'input_ids' has " + std::to_string(seq.ids.size()));
      }
    }
    if (static_cast<int64_t>(seq.ids.size()) > seq_len) {
      seq.ids.resize(seq_len);
      if (!seq.labels.empty()) seq.labels.resize(seq_len);
    }
    if (seq.ids.size() < 2) return Status::InvalidArgument(where + ": a sequence needs at least 2 tokens");
    ds.seqs_.push_back(std::move(seq));
  }
  if (ds.seqs_.empty()) return Status::InvalidArgument(path + ": no sequences");
  return ds;
}

int64_t TokenDataset::IndexAt(int64_t cursor, bool shuffle, uint64_t seed) const {
  const int64_t n = size();
  const int64_t epoch = cursor / n, pos = cursor % n;
  if (!shuffle) return pos;
  if (perm_epoch_ != epoch) {
    // Fisher-Yates driven by counter-based random numbers: a pure function of (seed, epoch).
    perm_.resize(n);
    std::iota(perm_.begin(), perm_.end(), 0);
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(UniformIndex(HashKeys(seed, 0x5EED, epoch, i), i + 1));
      std::swap(perm_[i], perm_[j]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[pos];
}

MicroBatch TokenDataset::MakeBatch(int64_t first, int64_t count, bool shuffle, uint64_t seed) const {
  MicroBatch mb;
  mb.batch = count;
  mb.first_sequence = first;
  for (int64_t i = 0; i < count; ++i) {
    mb.seq = std::max<int64_t>(mb.seq, at(IndexAt(first + i, shuffle, seed)).ids.size());
  }
  mb.ids.assign(mb.rows(), 0);
  mb.targets.assign(mb.rows(), -100);
  mb.positions.resize(mb.rows());
  for (int64_t b = 0; b < count; ++b) {
    const TokenSequence& s = at(IndexAt(first + b, shuffle, seed));
    const int64_t n = static_cast<int64_t>(s.ids.size());
    for (int64_t t = 0; t < mb.seq; ++t) {
      mb.positions[b * mb.seq + t] = static_cast<int32_t>(t);
      if (t >= n) continue;
      mb.ids[b * mb.seq + t] = s.ids[t];
      if (t + 1 < n) mb.targets[b * mb.seq + t] = s.labels.empty() ? s.ids[t + 1] : s.labels[t + 1];
    }
  }
  return mb;
}

int64_t TokenDataset::CountTargets(int64_t first, int64_t count, bool shuffle, uint64_t seed) const {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    const TokenSequence& s = at(IndexAt(first + i, shuffle, seed));
    if (s.labels.empty()) {
      total += static_cast<int64_t>(s.ids.size()) - 1;
    } else {
      total += std::count_if(s.labels.begin() + 1, s.labels.end(), [](int32_t v) { return v != -100; });
    }
  }
  return total;
}

}  // namespace ft
