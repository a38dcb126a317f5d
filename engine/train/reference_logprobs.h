// A full fine-tune's DPO reference (TRL's precompute_ref_log_probs): the response
// log-probabilities of every preference pair under the model as loaded, before any step, computed
// once and kept in a file beside the data index, so that neither a second copy of the weights nor
// a recomputation on every resume is needed. (LoRA and QLoRA take theirs from the model with the
// adapter off: engine/train/objective.h.)
//
// The file, <data.train>.ftref-<16 hex of the key's SHA-256>: a JSON header line {"format",
// "version", "key", "rows"}, then per dataset row the chosen and the rejected response's
// (sum of log p as a double, target count as an int64), then the SHA-256 (hex) of everything
// before it. The key names what the values depend on (the data and its encoding, the model's
// files, the compute dtype and device); the caller builds it.
//
// Each pair is computed alone (a micro-batch of its two sequences, evaluation mode), so the values
// do not depend on the batch plan, the world size or the rank: a resume elsewhere that finds no
// file recomputes the same numbers.
//
// Thread safety: immutable once made.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/data/dataset.h"
#include "engine/model/model.h"

namespace ft {

class ReferenceLogProbs {
 public:
  // Reads the file for `key` beside the data when it is whole and for this key and data; else
  // computes every pair with `model` (which must hold the reference weights: call before any step
  // or checkpoint restore) and, when `keep` (one rank of several), writes the file (a write that
  // fails is logged: the values are used, and a resume recomputes them). A damaged file is logged and
  // replaced. Errors: Cancelled when stop_requested said so between pairs; a batch the dataset cannot make.
  static StatusOr<std::unique_ptr<ReferenceLogProbs>> LoadOrCompute(
      Model& model, const Dataset& data, const std::string& data_path, const std::string& key, bool keep,
      const std::function<bool()>& stop_requested);

  // The reference's chosen ([0]) and rejected ([1]) log-probabilities of dataset row `row`.
  const SequenceLogProb* Pair(int64_t row) const { return &values_[static_cast<size_t>(2 * row)]; }
  int64_t rows() const { return static_cast<int64_t>(values_.size() / 2); }
  bool from_file() const { return from_file_; }
  const std::string& path() const { return path_; }

  // The file for `key` beside `data_path`.
  static std::string PathFor(const std::string& data_path, const std::string& key);

 private:
  ReferenceLogProbs() = default;
  Status Load(const std::string& key, int64_t rows);
  std::string Serialize(const std::string& key) const;

  std::vector<SequenceLogProb> values_;  // 2 per row: chosen, rejected
  bool from_file_ = false;
  std::string path_;
};

}  // namespace ft
