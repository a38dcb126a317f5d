// Training data: a JSONL file streamed through a line index, turned into
// training rows (one example each, or several packed into seq_len), and the
// sequence-level order the trainer walks through them.
//
// Opening a file makes one streaming pass (the file is never loaded whole):
// every line is parsed and encoded once to learn its token and target counts
// and to find bad lines. The result is cached beside the data as
// <file>.ftidx, keyed by the file's SHA-256 and by `cache_key` (format,
// tokenizer, seq_len), so a restart or a second epoch does not re-tokenize to
// plan. A damaged index (its own checksum, or a field the data file cannot
// hold) is rebuilt, with a warning; a line that no longer matches the index
// when read removes the index, so the next open re-indexes. Rows are re-read and re-encoded from their byte
// offsets on demand.
//
// Rows: without packing, one example per row (right-padded in a micro-batch,
// targets -100 on padding). With packing, examples are placed greedily in
// file order into rows of seq_len tokens without splitting them (an example
// longer than seq_len is truncated); positions restart and attention is
// confined per example (segments), and no target crosses an example boundary.
//
// Order: a pure function of (seed, epoch): file order when shuffle is off,
// else a seeded permutation of the rows per epoch. A cursor (rows consumed,
// across epochs) is all a checkpoint needs to resume exactly, whatever the
// micro-batch plan.
//
// Thread safety: const methods may be called from one thread at a time (a
// small permutation cache is kept).
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <istream>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/data/file_identity.h"
#include "engine/model/model.h"

namespace ft {

// One encoded example. labels[t] is the token to learn at position t, or
// -100 for none; a sequence of n tokens yields targets labels[1..n-1] for
// positions 0..n-2 (HF's shift). Empty labels mean labels = ids.
struct TokenSequence {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;
  // A preference pair (data.format: preference): ids/labels above are the prompt and the chosen
  // response, these the prompt and the rejected one (labels -100 on the prompt). Empty otherwise.
  std::vector<int32_t> rejected_ids, rejected_labels;
  bool is_pair() const { return !rejected_ids.empty(); }
};

// Encodes one JSONL line (`where` = "file:line" for messages).
using RecordEncoder =
    std::function<StatusOr<TokenSequence>(const std::string& line, const std::string& where)>;

struct DatasetOptions {
  std::string path;
  int64_t seq_len = 2048;
  bool packing = false;
  bool skip_bad_lines = false;  // skip (and count) lines that fail to parse or encode
  std::string cache_key;        // what else the encoding depends on (format, tokenizer, vocab)
  bool use_cache = true;        // read/write <path>.ftidx
  // Every example is a preference pair (TokenSequence::is_pair): a row is one pair, and a
  // micro-batch holds its chosen and rejected sequences as batch rows 2i and 2i + 1.
  bool pairs = false;
  // data.val_fraction: this fraction of the usable lines, chosen by a hash of each line's bytes
  // (so appending lines or resuming never moves one across), is held out. `held_out`: this
  // Dataset is that part (the eval set) instead of the rest.
  double holdout = 0;
  bool held_out = false;
  // Polled between lines while the file is indexed: true stops Open with Cancelled (a stop
  // request during data preparation). Unset: never.
  std::function<bool()> stop_requested;
};

// One sequence of a micro-batch before padding: its tokens, each one's target (-100 = none),
// position and segment (the example it belongs to within a packed row).
struct BatchRow {
  std::vector<int32_t> ids, targets, positions, segments;
};
// The micro-batch of `rows`, right-padded to the longest (segments kept when `packing`).
MicroBatch AssembleBatch(const std::vector<BatchRow>& rows, bool packing);

class Dataset {
 public:
  // Indexes `options.path` (or loads a valid cached index). Errors: NotFound
  // for a missing file; InvalidArgument naming file:line and the reason for a
  // bad line (unless skip_bad_lines) or when no example is usable, or naming
  // both hashes when the file changed while it was indexed; Cancelled when
  // options.stop_requested said so.
  static StatusOr<std::unique_ptr<Dataset>> Open(const DatasetOptions& options, RecordEncoder encode);

  int64_t size() const { return static_cast<int64_t>(row_first_.size()) - 1; }  // rows
  int64_t examples() const { return static_cast<int64_t>(example_line_.size()); }
  int64_t total_tokens() const;  // of every example (after truncation to seq_len)
  int64_t skipped_lines() const { return skipped_; }
  bool from_cache() const { return from_cache_; }
  // Lowercase hex SHA-256 of the data file's contents when it was opened.
  const std::string& sha256() const { return sha256_; }
  // What else the encoding depends on (DatasetOptions::cache_key) and the rows' length bound.
  const std::string& cache_key() const { return options_.cache_key; }
  int64_t seq_len() const { return options_.seq_len; }
  // ";holdout=<fraction>;held_out=<0|1>" when a split applies (the index holds every line; a
  // value derived per row, such as a DPO reference, depends on the side), else "".
  std::string holdout_key() const;
  uint64_t file_bytes() const { return file_bytes_; }  // its size then
  // Its stamp before it was hashed (engine/data/file_identity.h).
  const FileStamp& stamp() const { return stamp_; }
  // OK while the file holds the contents it was opened with; InvalidArgument
  // naming the file and both hashes once it changed (InputFiles::Check).
  // MakeBatch checks it too when a line no longer matches the index.
  Status CheckUnchanged() const { return file_.Check(); }

  // Row index at global position `cursor` (epoch = cursor / size()).
  int64_t RowAt(int64_t cursor, bool shuffle, uint64_t seed) const;
  // The micro-batch of the rows at cursor positions [first, first + count).
  // Packed rows are seq_len long; unpacked ones padded to the longest.
  StatusOr<MicroBatch> MakeBatch(int64_t first, int64_t count, bool shuffle, uint64_t seed) const;
  // Target tokens among those rows (from the index; no re-encoding).
  int64_t CountTargets(int64_t first, int64_t count, bool shuffle, uint64_t seed) const;
  int64_t RowTargets(int64_t row) const { return row_targets_[row]; }
  // Appends row `row`'s batch rows to `out` (one; a pair's two: chosen, then rejected), reading
  // its examples from `in` (the data file, opened with OpenForReading).
  Status ReadRow(std::istream& in, int64_t row, std::vector<BatchRow>* out) const;
  StatusOr<std::unique_ptr<std::ifstream>> OpenForReading() const;
  bool packing() const { return options_.packing; }
  bool pairs() const { return options_.pairs; }
  const std::string& path() const { return options_.path; }

 private:
  struct Line {
    uint64_t offset = 0;
    uint32_t bytes = 0;
    int32_t tokens = -1;  // after truncation to seq_len; -1 = bad line (skipped)
    int32_t targets = 0;
  };
  Dataset() = default;
  Status BuildIndex(const std::string& sha);
  // The cached index when it is for this data and settings: NotFound when
  // absent or for other data; Corruption when damaged (bad checksum, a count
  // or offset the data file cannot hold, impossible token counts).
  Status LoadCache(const std::string& sha);
  Status CheckIndexLines(const std::vector<Line>& lines) const;
  // Whether each line is on this Dataset's side of options_.holdout (all true without one).
  StatusOr<std::vector<bool>> HoldoutSides() const;
  void SaveCache(const std::string& sha) const;
  void PlanRows();
  // Re-reads and encodes one example from `in` (the data file, opened once per batch).
  StatusOr<TokenSequence> ReadExample(std::istream& in, int64_t example) const;

  DatasetOptions options_;
  RecordEncoder encode_;
  std::vector<Line> lines_;
  std::vector<int64_t> example_line_;  // usable examples → line index
  std::vector<int64_t> row_first_;     // row r holds examples [row_first_[r], row_first_[r + 1])
  std::vector<int64_t> row_targets_;
  int64_t skipped_ = 0;
  uint64_t file_bytes_ = 0;  // the data file's size when indexed
  std::string sha256_;       // of the data file's contents
  FileStamp stamp_;          // of the data file, taken before it was hashed
  mutable InputFiles file_;  // the data file: stamp_ and sha256_
  bool from_cache_ = false;
  mutable std::vector<int64_t> perm_;
  mutable int64_t perm_epoch_ = -1;
};

// The `tokens` format: {"input_ids": [...], "labels": [...]?}, ids in
// [0, vocab_size), labels -100 or ids.
StatusOr<TokenSequence> ParseTokensRecord(const std::string& line, const std::string& where,
                                          int64_t vocab_size);

}  // namespace ft
