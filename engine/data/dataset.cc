#include "engine/data/dataset.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/confined_path.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "engine/data/data_format.h"
#include "engine/model/rng.h"

namespace ft {

namespace fs = std::filesystem;

namespace {

// Version 2 ends with the SHA-256 (hex) of everything before it.
constexpr char kIndexMagic[8] = {'F', 'T', 'I', 'D', 'X', '0', '0', '2'};
constexpr size_t kIndexChecksumBytes = 64;
// One line's record: offset (8), bytes (4), tokens (4), targets (4).
constexpr size_t kIndexLineBytes = 20;

// Appends a POD value's bytes / reads one back.
template <typename T>
void Put(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
bool Get(const std::string& in, size_t* pos, T* v) {
  if (*pos + sizeof(T) > in.size()) return false;
  std::memcpy(v, in.data() + *pos, sizeof(T));
  *pos += sizeof(T);
  return true;
}

// The targets of the first n tokens of `seq` (labels[1..n) that are not -100).
// `labels` of a sequence of n tokens (empty: labels = ids, every position a target).
int32_t TargetCount(const std::vector<int32_t>& labels, int64_t n) {
  if (n < 1) return 0;
  if (labels.empty()) return static_cast<int32_t>(n - 1);
  return static_cast<int32_t>(
      std::count_if(labels.begin() + 1, labels.begin() + n, [](int32_t v) { return v != -100; }));
}

// An example's index entry: its tokens after truncation to seq_len (a pair's longer sequence)
// and its targets (a pair's two sequences together).
struct ExampleCounts {
  int64_t tokens = 0;
  int32_t targets = 0;
};
ExampleCounts CountExample(const TokenSequence& seq, int64_t seq_len) {
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(seq.ids.size()), seq_len);
  if (!seq.is_pair()) return {n, TargetCount(seq.labels, n)};
  const int64_t r = std::min<int64_t>(static_cast<int64_t>(seq.rejected_ids.size()), seq_len);
  return {std::max(n, r), TargetCount(seq.labels, n) + TargetCount(seq.rejected_labels, r)};
}

// Keeps the first seq_len tokens of each of the example's sequences.
void Truncate(TokenSequence& seq, int64_t seq_len) {
  for (auto* v : {&seq.ids, &seq.labels, &seq.rejected_ids, &seq.rejected_labels}) {
    if (static_cast<int64_t>(v->size()) > seq_len) v->resize(static_cast<size_t>(seq_len));
  }
}

}  // namespace

StatusOr<TokenSequence> ParseTokensRecord(const std::string& line, const std::string& where,
                                          int64_t vocab_size) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(where + ": not a JSON object");
  return ParseTokensJson(j, where, vocab_size);
}

StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const DatasetOptions& options, RecordEncoder encode) {
  std::unique_ptr<Dataset> ds(new Dataset());
  ds->options_ = options;
  // Token counts depend on truncation, so seq_len is part of what the index is for.
  ds->options_.cache_key =
      options.cache_key + ";seq_len=" + std::to_string(options.seq_len) + (options.pairs ? ";pairs" : "");
  FT_CHECK(!options.pairs || !options.packing);  // a pair is a row of its own (job_spec.cc refuses packing)
  ds->encode_ = std::move(encode);
  // Stamped before the hash, so a change after it shows (within the allowed roots, as every open).
  FT_ASSIGN_OR_RETURN(const std::string confined, Confine(options.path));
  FT_ASSIGN_OR_RETURN(ds->stamp_, StampFile(confined));
  FT_ASSIGN_OR_RETURN(std::string sha, Sha256File(options.path, &ds->file_bytes_));
  ds->sha256_ = sha;
  ds->file_.Add("", options.path, ds->stamp_, sha);
  Status cached = options.use_cache ? ds->LoadCache(sha) : Status::NotFound("not cached");
  if (cached.code() == Status::Code::kCorruption) {
    // Loud: a damaged index would otherwise abort or train on wrong counts; it is rebuilt.
    FT_LOG(ERROR) << "DAMAGED DATA INDEX " << options.path << ".ftidx (" << cached.message()
                  << "): rebuilding it from " << options.path;
    std::fprintf(stderr, "ft-train: WARNING: damaged data index %s.ftidx (%s): rebuilt from the data\n",
                 options.path.c_str(), std::string(cached.message()).c_str());
  }
  if (!cached.ok()) {
    FT_RETURN_IF_ERROR(ds->BuildIndex(sha));
    // An index of a file that changed while it was read would be cached under the old hash.
    FT_RETURN_IF_ERROR(ds->CheckUnchanged());
    if (options.use_cache) ds->SaveCache(sha);
  }
  FT_ASSIGN_OR_RETURN(const std::vector<bool> sides, ds->HoldoutSides());
  for (int64_t i = 0; i < static_cast<int64_t>(ds->lines_.size()); ++i) {
    if (ds->lines_[i].tokens >= 0 && sides[i]) ds->example_line_.push_back(i);
  }
  if (ds->example_line_.empty()) {
    if (options.holdout > 0) {
      return Status::InvalidArgument(options.path + ": data.val_fraction " + std::to_string(options.holdout) +
                                     (options.held_out ? " holds out no example; raise it or give data.eval"
                                                       : " holds out every example; lower it"));
    }
    return Status::InvalidArgument(options.path + ": no usable examples");
  }
  if (ds->skipped_ > 0) {
    FT_LOG(WARN) << options.path << ": skipped " << ds->skipped_ << " bad lines (data.skip_bad_lines)";
  }
  ds->PlanRows();
  return ds;
}

int64_t Dataset::total_tokens() const {
  int64_t total = 0;
  for (int64_t line : example_line_) total += lines_[line].tokens;
  return total;
}

std::string Dataset::holdout_key() const {
  if (options_.holdout <= 0) return "";
  char text[64];
  std::snprintf(text, sizeof(text), ";holdout=%.17g;held_out=%d", options_.holdout,
                options_.held_out ? 1 : 0);
  return text;
}

StatusOr<std::vector<bool>> Dataset::HoldoutSides() const {
  std::vector<bool> sides(lines_.size(), true);
  if (options_.holdout <= 0) return sides;
  FT_ASSIGN_OR_RETURN(std::unique_ptr<std::ifstream> in, OpenForReading());
  // A line is held out when the first 64 bits of its bytes' SHA-256 fall below holdout x 2^64.
  const double bound = options_.holdout * 18446744073709551616.0;
  std::string text;
  for (size_t i = 0; i < lines_.size(); ++i) {
    const Line& l = lines_[i];
    if (l.tokens < 0) continue;
    text.resize(l.bytes);
    in->seekg(static_cast<std::streamoff>(l.offset));
    in->read(text.data(), l.bytes);
    if (!*in)
      return Status::IOError(options_.path + ": cannot read the line at byte " + std::to_string(l.offset));
    const uint64_t h = std::stoull(Sha256Hex(text).substr(0, 16), nullptr, 16);
    sides[i] = (static_cast<double>(h) < bound) == options_.held_out;
  }
  return sides;
}

Status Dataset::BuildIndex(const std::string& sha) {
  (void)sha;
  std::ifstream in(options_.path, std::ios::binary);
  if (!in) return Status::NotFound(options_.path + ": cannot open training data");
  std::string line;
  uint64_t offset = 0;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (options_.stop_requested && options_.stop_requested()) {
      return Status::Cancelled(options_.path + ": indexing stopped at line " + std::to_string(lineno) +
                               ": a stop was requested");
    }
    const uint64_t start = offset;
    offset += line.size() + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = options_.path + ":" + std::to_string(lineno);
    Line entry{start, static_cast<uint32_t>(line.size()), -1, 0};
    StatusOr<TokenSequence> seq = encode_(line, where);
    if (seq.status().code() == Status::Code::kCancelled) return seq.status();  // a stop, not a bad line
    Status bad;
    if (!seq.ok()) {
      bad = seq.status();
    } else if (seq->ids.size() < 2 || (seq->is_pair() && seq->rejected_ids.size() < 2)) {
      bad = Status::InvalidArgument(where + ": an example needs at least 2 tokens");
    } else if (seq->is_pair() != options_.pairs) {
      bad = Status::InvalidArgument(where +
                                    (options_.pairs ? ": not a preference pair" : ": a preference pair"));
    }
    if (!bad.ok()) {
      if (!options_.skip_bad_lines) {
        return Status::InvalidArgument(bad.message() +
                                       " (or set data.skip_bad_lines: true to skip and count bad lines)");
      }
      ++skipped_;
      lines_.push_back(entry);
      continue;
    }
    const ExampleCounts counts = CountExample(*seq, options_.seq_len);
    entry.tokens = static_cast<int32_t>(counts.tokens);
    entry.targets = counts.targets;
    lines_.push_back(entry);
  }
  if (in.bad()) return Status::IOError(options_.path + ": read failed");
  return Status::OK();
}

Status Dataset::LoadCache(const std::string& sha) {
  auto data = ReadFileToString(options_.path + ".ftidx");
  if (!data.ok())
    return data.status().IsNotFound() ? data.status() : Status::Corruption(data.status().message());
  const std::string& s = *data;
  if (s.size() >= sizeof(kIndexMagic) && std::memcmp(s.data(), kIndexMagic, 5) == 0 &&
      std::memcmp(s.data(), kIndexMagic, sizeof(kIndexMagic)) != 0) {
    return Status::NotFound("an index of another version");  // rebuilt quietly
  }
  if (s.size() < sizeof(kIndexMagic) + kIndexChecksumBytes ||
      std::memcmp(s.data(), kIndexMagic, sizeof(kIndexMagic)) != 0) {
    return Status::Corruption("not an index (bad magic or too short)");
  }
  const size_t body = s.size() - kIndexChecksumBytes;
  if (Sha256Hex(s.substr(0, body)) != s.substr(body)) return Status::Corruption("checksum mismatch");
  size_t pos = sizeof(kIndexMagic);
  auto get_string = [&](std::string* out) {
    uint32_t len = 0;
    if (!Get(s, &pos, &len) || len > body - pos) return false;
    out->assign(s.data() + pos, len);
    pos += len;
    return true;
  };
  std::string file_sha, key;
  uint64_t count = 0;
  if (!get_string(&file_sha) || !get_string(&key) || !Get(s, &pos, &count) || pos > body) {
    return Status::Corruption("short header");
  }
  if (file_sha != sha || key != options_.cache_key)
    return Status::NotFound("index is for other data or settings");
  // The count must be what the file holds, checked before anything is allocated for it.
  if (count != (body - pos) / kIndexLineBytes || (body - pos) % kIndexLineBytes != 0) {
    return Status::Corruption("it claims " + std::to_string(count) + " lines but holds " +
                              std::to_string((body - pos) / kIndexLineBytes));
  }
  std::vector<Line> lines(count);
  for (Line& l : lines) {
    Get(s, &pos, &l.offset);
    Get(s, &pos, &l.bytes);
    Get(s, &pos, &l.tokens);
    Get(s, &pos, &l.targets);
  }
  FT_RETURN_IF_ERROR(CheckIndexLines(lines));
  const int64_t skipped =
      std::count_if(lines.begin(), lines.end(), [](const Line& l) { return l.tokens < 0; });
  if (skipped > 0 && !options_.skip_bad_lines) return Status::NotFound("index skips lines; re-validate");
  lines_ = std::move(lines);
  skipped_ = skipped;
  from_cache_ = true;
  return Status::OK();
}

Status Dataset::CheckIndexLines(const std::vector<Line>& lines) const {
  // Each line inside the data file, after the one before it; counts as BuildIndex makes them.
  uint64_t next = 0;  // the first byte a line may start at
  for (size_t i = 0; i < lines.size(); ++i) {
    const Line& l = lines[i];
    auto which = [i] { return "line entry " + std::to_string(i) + ": "; };
    if (l.offset < next || l.offset > file_bytes_ || l.bytes > file_bytes_ - l.offset) {
      return Status::Corruption(which() + "bytes [" + std::to_string(l.offset) + ", +" +
                                std::to_string(l.bytes) + ") are out of order or beyond the file's " +
                                std::to_string(file_bytes_));
    }
    next = l.offset + l.bytes + 1;
    const bool bad_line = l.tokens == -1 && l.targets == 0;
    const int64_t sequences = options_.pairs ? 2 : 1;  // a pair's targets are both sequences'
    const bool example =
        l.tokens >= 2 && l.tokens <= options_.seq_len && l.targets >= 0 && l.targets < sequences * l.tokens;
    if (!bad_line && !example) {
      return Status::Corruption(which() + std::to_string(l.tokens) + " tokens and " +
                                std::to_string(l.targets) + " targets are impossible at seq_len " +
                                std::to_string(options_.seq_len));
    }
  }
  return Status::OK();
}

void Dataset::SaveCache(const std::string& sha) const {
  std::string out(kIndexMagic, sizeof(kIndexMagic));
  Put(&out, static_cast<uint32_t>(sha.size()));
  out += sha;
  Put(&out, static_cast<uint32_t>(options_.cache_key.size()));
  out += options_.cache_key;
  Put(&out, static_cast<uint64_t>(lines_.size()));
  for (const Line& l : lines_) {
    Put(&out, l.offset);
    Put(&out, l.bytes);
    Put(&out, l.tokens);
    Put(&out, l.targets);
  }
  out += Sha256Hex(out);
  Status s = ReplaceFileAtomically(options_.path + ".ftidx", out);
  if (!s.ok()) FT_LOG(WARN) << "cannot cache the data index (it will be rebuilt next time): " << s.ToString();
}

void Dataset::PlanRows() {
  row_first_.clear();
  row_targets_.clear();
  int64_t used = 0;
  for (int64_t e = 0; e < examples(); ++e) {
    const Line& l = lines_[example_line_[e]];
    if (row_first_.empty() || !options_.packing || used + l.tokens > options_.seq_len) {
      row_first_.push_back(e);
      row_targets_.push_back(0);
      used = 0;
    }
    used += l.tokens;
    row_targets_.back() += l.targets;
  }
  row_first_.push_back(examples());
}

int64_t Dataset::RowAt(int64_t cursor, bool shuffle, uint64_t seed) const {
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

StatusOr<TokenSequence> Dataset::ReadExample(std::istream& in, int64_t example) const {
  const Line& l = lines_[example_line_[example]];
  std::string text(l.bytes, '\0');
  in.seekg(static_cast<std::streamoff>(l.offset));
  in.read(text.data(), l.bytes);
  // A line that read or encoded when indexed and no longer does: a changed file says so by name.
  if (!in) {
    FT_RETURN_IF_ERROR(CheckUnchanged());
    return Status::IOError(options_.path + ": cannot read the line at byte " + std::to_string(l.offset));
  }
  StatusOr<TokenSequence> encoded = encode_(text, options_.path + " (byte " + std::to_string(l.offset) + ")");
  if (!encoded.ok() && encoded.status().code() != Status::Code::kCancelled) {
    FT_RETURN_IF_ERROR(CheckUnchanged());
  }
  FT_ASSIGN_OR_RETURN(TokenSequence seq, std::move(encoded));
  Truncate(seq, options_.seq_len);
  const ExampleCounts counts = CountExample(seq, options_.seq_len);
  const int64_t n = counts.tokens;
  const int32_t targets = counts.targets;
  if (n != l.tokens || (n >= 1 && targets != l.targets)) {
    // The data changed since Open, or the index lies: either way the next Open must re-index.
    std::error_code ec;
    if (options_.use_cache) fs::remove(options_.path + ".ftidx", ec);
    FT_RETURN_IF_ERROR(CheckUnchanged());  // a changed file is the job's input, named with both hashes
    return Status::Corruption(options_.path + ": changed since it was indexed (the line at byte " +
                              std::to_string(l.offset) + " has " + std::to_string(n) + " tokens, " +
                              std::to_string(targets) + " targets; the index says " +
                              std::to_string(l.tokens) + ", " + std::to_string(l.targets) +
                              "); its index was removed: restart to re-index");
  }
  return seq;
}

StatusOr<std::unique_ptr<std::ifstream>> Dataset::OpenForReading() const {
  FT_ASSIGN_OR_RETURN(const std::string confined, Confine(options_.path));  // at every open (roots)
  auto in = std::make_unique<std::ifstream>(confined, std::ios::binary);
  if (!*in) return Status::IOError(options_.path + ": cannot open training data");
  return in;
}

Status Dataset::ReadRow(std::istream& in, int64_t row, std::vector<BatchRow>* out) const {
  auto append = [](BatchRow& r, const std::vector<int32_t>& ids, const std::vector<int32_t>& given_labels,
                   int32_t segment) {
    const std::vector<int32_t>& labels = given_labels.empty() ? ids : given_labels;
    const int64_t n = static_cast<int64_t>(ids.size());
    for (int64_t t = 0; t < n; ++t) {
      r.ids.push_back(ids[t]);
      r.targets.push_back(t + 1 < n ? labels[t + 1] : -100);  // no target across examples
      r.positions.push_back(static_cast<int32_t>(t));
      r.segments.push_back(segment);
    }
  };
  // Pairs: a data row becomes two batch rows (chosen, rejected).
  const size_t first = out->size();
  out->resize(first + (options_.pairs ? 2 : 1));
  for (int64_t e = row_first_[row]; e < row_first_[row + 1]; ++e) {
    FT_ASSIGN_OR_RETURN(TokenSequence seq, ReadExample(in, e));
    append((*out)[first], seq.ids, seq.labels, static_cast<int32_t>(e - row_first_[row]));
    if (options_.pairs) append((*out)[first + 1], seq.rejected_ids, seq.rejected_labels, 0);
  }
  return Status::OK();
}

MicroBatch AssembleBatch(const std::vector<BatchRow>& rows, bool packing) {
  MicroBatch mb;
  mb.batch = static_cast<int64_t>(rows.size());
  for (const BatchRow& row : rows) mb.seq = std::max<int64_t>(mb.seq, static_cast<int64_t>(row.ids.size()));
  mb.ids.assign(mb.rows(), 0);
  mb.targets.assign(mb.rows(), -100);
  mb.positions.assign(mb.rows(), 0);
  if (packing) mb.segments.assign(mb.rows(), -1);  // padding: its own segment
  for (int64_t b = 0; b < mb.batch; ++b) {
    const BatchRow& row = rows[b];
    for (size_t t = 0; t < row.ids.size(); ++t) {
      const int64_t i = b * mb.seq + static_cast<int64_t>(t);
      mb.ids[i] = row.ids[t];
      mb.targets[i] = row.targets[t];
      mb.positions[i] = row.positions[t];
      if (packing) mb.segments[i] = row.segments[t];
    }
    for (int64_t t = static_cast<int64_t>(row.ids.size()); t < mb.seq; ++t) {
      mb.positions[b * mb.seq + t] = static_cast<int32_t>(t);
    }
  }
  return mb;
}

StatusOr<MicroBatch> Dataset::MakeBatch(int64_t first, int64_t count, bool shuffle, uint64_t seed) const {
  FT_ASSIGN_OR_RETURN(std::unique_ptr<std::ifstream> in, OpenForReading());
  std::vector<BatchRow> rows;
  std::vector<int64_t> data_rows;
  for (int64_t b = 0; b < count; ++b) {
    const int64_t r = RowAt(first + b, shuffle, seed);
    data_rows.push_back(r);
    FT_RETURN_IF_ERROR(ReadRow(*in, r, &rows));
  }
  MicroBatch mb = AssembleBatch(rows, options_.packing);
  mb.first_sequence = first * (options_.pairs ? 2 : 1);
  mb.data_rows = std::move(data_rows);
  return mb;
}

int64_t Dataset::CountTargets(int64_t first, int64_t count, bool shuffle, uint64_t seed) const {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += row_targets_[RowAt(first + i, shuffle, seed)];
  return total;
}

}  // namespace ft
