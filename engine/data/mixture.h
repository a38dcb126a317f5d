// The rows a job trains (or evaluates) on, over one or more sources
// (job.yaml's data.train / data.eval as a list), each a Dataset.
//
// Order is a pure function of (sources, seed, cursor), so a resume, another
// world size or an elastic world reads the same rows in the same order:
//   one source: the Dataset's own order (Dataset::RowAt), exactly as a job
//     with a single data.train path has always trained;
//   interleave (data.train): the stream is cut into blocks of block() rows;
//     source k has quota(k) slots in every block, its share of the block
//     rounded by largest remainder, and the slots are spread evenly through
//     the block (source k's j-th slot sits at (j + 1/2) / quota(k) of it).
//     The row in a slot is the next of that source's own stream: its rows in
//     its own seeded order, epoch after epoch (Dataset::RowAt with a seed of
//     the job's seed and k). Shares: weight (normalised), or epochs x rows.
//     So the rows source k has given before cursor c (Positions) follow from
//     c alone; a checkpoint records them and a resume checks them.
//   concatenate (data.eval): every row of each source in turn, in file order.
// Packing happens inside each source (a packed row holds one source's
// examples, each in its own attention segment); a micro-batch mixes sources.
//
// Failure: InvalidArgument when a share is too small to have a slot in a
// block of 2^20 rows. Thread safety: as Dataset (const methods from one
// thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/data/dataset.h"

namespace ft {

struct MixtureSource {
  std::unique_ptr<Dataset> data;
  double weight = 1;  // share of rows (normalised over the sources); 0 when epochs is used
  double epochs = 0;  // passes over the source per pass of the mixture
  std::string key;    // "data.train[1]", for messages
};

class Mixture {
 public:
  enum class Mode { kInterleave, kConcatenate };
  static StatusOr<std::unique_ptr<Mixture>> Create(std::vector<MixtureSource> sources, Mode mode);

  // Rows per pass of the mixture (train.epochs counts these): the sum of every source's rows
  // (weights; a single path), or of epochs x rows (epochs; concatenation: rows).
  int64_t size() const { return size_; }
  int sources() const { return static_cast<int>(sources_.size()); }
  const Dataset& source(int k) const { return *sources_[k].data; }
  const std::string& key(int k) const { return sources_[k].key; }
  // The rows each source has given before `cursor` (one entry per source).
  std::vector<int64_t> Positions(int64_t cursor) const;
  // Source k's share of the rows: its quota of a block (interleave), its rows of the whole
  // (concatenate), 1 (one source).
  double share(int k) const;
  // Interleave: rows per block and each source's slots in it.
  int64_t block() const { return block_; }
  int64_t quota(int k) const { return quota_[k]; }

  // The source and its row at `cursor`.
  struct Slot {
    int source = 0;
    int64_t row = 0;
  };
  Slot At(int64_t cursor, bool shuffle, uint64_t seed) const;
  // As Dataset's, over the mixture's cursor. MicroBatch::data_rows holds each row's index within
  // its source.
  StatusOr<MicroBatch> MakeBatch(int64_t first, int64_t count, bool shuffle, uint64_t seed) const;
  int64_t CountTargets(int64_t first, int64_t count, bool shuffle, uint64_t seed) const;

  // engine/job/job_hash.h's SourcesSha256 of the sources' contents.
  const std::string& sha256() const { return sha256_; }
  uint64_t file_bytes() const;
  // OK while every source holds what it was opened with (Dataset::CheckUnchanged).
  Status CheckUnchanged() const;

 private:
  Mixture() = default;
  Status PlanBlock();
  // Source k's stream seed (the job's seed for a single source, as it always was).
  uint64_t SourceSeed(int k, uint64_t seed) const;

  std::vector<MixtureSource> sources_;
  Mode mode_ = Mode::kInterleave;
  int64_t size_ = 0;
  std::string sha256_;
  // Interleave: the block's slots in order (source, and that source's slot count before it).
  int64_t block_ = 0;
  std::vector<int64_t> quota_;
  std::vector<int32_t> slot_source_;
  std::vector<int64_t> slot_rank_;
  // Concatenate: the first mixture row of each source, and the end.
  std::vector<int64_t> first_row_;
};

}  // namespace ft
