// Training data in the `tokens` format ({"input_ids": [...], "labels": [...]?}
// per line) and the sequence-level order the trainer walks through it.
//
// A sequence of n tokens gives n-1 targets (position t predicts token t+1,
// HF-style); with "labels", targets are labels[t+1] and -100 marks positions
// without loss. Sequences longer than seq_len are truncated. The order is a
// pure function of (seed, epoch): file order when shuffle is off, else a
// seeded permutation per epoch, so a cursor (a count of sequences consumed)
// is all a checkpoint needs to resume exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/model.h"

namespace ft {

struct TokenSequence {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // same length as ids, -100 = ignored; empty = ids
};

class TokenDataset {
 public:
  // Reads a JSONL file. Errors name file:line and the problem (bad JSON,
  // missing input_ids, token id outside [0, vocab_size), fewer than 2 tokens).
  static StatusOr<TokenDataset> Load(const std::string& path, int64_t vocab_size, int64_t seq_len);

  int64_t size() const { return static_cast<int64_t>(seqs_.size()); }
  const TokenSequence& at(int64_t i) const { return seqs_[i]; }

  // Index of the sequence at global position `cursor` (epoch = cursor / size()).
  int64_t IndexAt(int64_t cursor, bool shuffle, uint64_t seed) const;

  // Builds a right-padded micro-batch from the sequences at cursor positions
  // [first, first + count).
  MicroBatch MakeBatch(int64_t first, int64_t count, bool shuffle, uint64_t seed) const;
  // Number of target tokens among those positions.
  int64_t CountTargets(int64_t first, int64_t count, bool shuffle, uint64_t seed) const;

 private:
  std::vector<TokenSequence> seqs_;
  mutable std::vector<int64_t> perm_;  // permutation of the cached epoch
  mutable int64_t perm_epoch_ = -1;
};

}  // namespace ft
