#include "engine/data/mixture.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "engine/job/job_hash.h"
#include "engine/model/rng.h"

namespace ft {

namespace {

// The smallest block, and the largest a share too small for it may grow to.
constexpr int64_t kMinBlock = 4096;
constexpr int64_t kMaxBlock = int64_t{1} << 20;

// `total` slots shared by `shares` (summing to 1) by largest remainder (ties: the earlier source).
std::vector<int64_t> Apportion(const std::vector<double>& shares, int64_t total) {
  std::vector<int64_t> quota(shares.size());
  std::vector<std::pair<double, size_t>> remainders;
  int64_t given = 0;
  for (size_t k = 0; k < shares.size(); ++k) {
    const double exact = shares[k] * static_cast<double>(total);
    quota[k] = static_cast<int64_t>(std::floor(exact));
    given += quota[k];
    remainders.emplace_back(exact - std::floor(exact), k);
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < total && i < remainders.size(); ++i, ++given) ++quota[remainders[i].second];
  return quota;
}

}  // namespace

StatusOr<std::unique_ptr<Mixture>> Mixture::Create(std::vector<MixtureSource> sources, Mode mode) {
  if (sources.empty()) return Status::InvalidArgument("a mixture needs at least one source");
  std::unique_ptr<Mixture> m(new Mixture());
  m->mode_ = mode;
  m->sources_ = std::move(sources);
  std::vector<std::string> shas;
  for (const MixtureSource& s : m->sources_) shas.push_back(s.data->sha256());
  m->sha256_ = SourcesSha256(shas);
  if (m->sources_.size() == 1) {  // its own order; `epochs` still sets the rows of a pass
    const MixtureSource& s = m->sources_[0];
    m->size_ = s.epochs > 0
                   ? std::max<int64_t>(1, std::llround(s.epochs * static_cast<double>(s.data->size())))
                   : s.data->size();
    return m;
  }
  if (mode == Mode::kConcatenate) {
    for (const MixtureSource& s : m->sources_) {
      m->first_row_.push_back(m->size_);
      m->size_ += s.data->size();
    }
    m->first_row_.push_back(m->size_);
    return m;
  }
  FT_RETURN_IF_ERROR(m->PlanBlock());
  return m;
}

Status Mixture::PlanBlock() {
  std::vector<double> amounts;
  double total = 0;
  for (const MixtureSource& s : sources_) {
    const double rows = static_cast<double>(s.data->size());
    amounts.push_back(s.epochs > 0 ? s.epochs * rows : s.weight);
    total += amounts.back();
    size_ += static_cast<int64_t>(std::llround(s.epochs > 0 ? s.epochs * rows : rows));
  }
  std::vector<double> shares;
  for (double a : amounts) shares.push_back(a / total);
  for (block_ = kMinBlock;; block_ *= 2) {
    quota_ = Apportion(shares, block_);
    if (std::all_of(quota_.begin(), quota_.end(), [](int64_t q) { return q > 0; })) break;
    if (block_ >= kMaxBlock) {
      const size_t k = std::find(quota_.begin(), quota_.end(), 0) - quota_.begin();
      return Status::InvalidArgument(sources_[k].key + ": its share (" + std::to_string(shares[k]) +
                                     ") is too small to give it a row in " + std::to_string(kMaxBlock) +
                                     "; raise its weight or epochs, or leave it out");
    }
  }
  // Source k's j-th slot at (2j + 1) / (2 quota_k) of the block: ordered by that fraction, compared
  // exactly as (2j + 1) * 2 quota_m against (2i + 1) * 2 quota_k; ties by source.
  std::vector<std::tuple<int64_t, int64_t, int32_t>> slots;  // (j, quota, source)
  for (size_t k = 0; k < quota_.size(); ++k) {
    for (int64_t j = 0; j < quota_[k]; ++j) slots.emplace_back(j, quota_[k], static_cast<int32_t>(k));
  }
  std::sort(slots.begin(), slots.end(), [](const auto& a, const auto& b) {
    const int64_t left = (2 * std::get<0>(a) + 1) * std::get<1>(b);  // < 2^41: quotas are at most 2^20
    const int64_t right = (2 * std::get<0>(b) + 1) * std::get<1>(a);
    return left != right ? left < right : std::get<2>(a) < std::get<2>(b);
  });
  for (const auto& [j, quota, k] : slots) {
    slot_source_.push_back(k);
    slot_rank_.push_back(j);
  }
  return Status::OK();
}

double Mixture::share(int k) const {
  if (sources_.size() == 1) return 1;
  if (mode_ == Mode::kConcatenate)
    return static_cast<double>(sources_[k].data->size()) / static_cast<double>(size_);
  return static_cast<double>(quota_[k]) / static_cast<double>(block_);
}

uint64_t Mixture::SourceSeed(int k, uint64_t seed) const {
  return sources_.size() == 1 ? seed : HashKeys(seed, 0x50C5, static_cast<uint64_t>(k));
}

Mixture::Slot Mixture::At(int64_t cursor, bool shuffle, uint64_t seed) const {
  if (sources_.size() == 1) return {0, sources_[0].data->RowAt(cursor, shuffle, seed)};
  if (mode_ == Mode::kConcatenate) {
    const int64_t pos = cursor % size_;
    const int k =
        static_cast<int>(std::upper_bound(first_row_.begin(), first_row_.end(), pos) - first_row_.begin()) -
        1;
    return {k, pos - first_row_[k]};
  }
  const int64_t b = cursor / block_, o = cursor % block_;
  const int k = slot_source_[o];
  const int64_t position = b * quota_[k] + slot_rank_[o];
  return {k, sources_[k].data->RowAt(position, shuffle, SourceSeed(k, seed))};
}

std::vector<int64_t> Mixture::Positions(int64_t cursor) const {
  std::vector<int64_t> positions(sources_.size(), 0);
  if (sources_.size() == 1) {
    positions[0] = cursor;
  } else if (mode_ == Mode::kConcatenate) {
    const int64_t passes = cursor / size_, pos = cursor % size_;
    for (size_t k = 0; k < sources_.size(); ++k) {
      positions[k] = passes * sources_[k].data->size() +
                     std::clamp<int64_t>(pos - first_row_[k], 0, sources_[k].data->size());
    }
  } else {
    const int64_t b = cursor / block_, o = cursor % block_;
    for (size_t k = 0; k < sources_.size(); ++k) positions[k] = b * quota_[k];
    for (int64_t i = 0; i < o; ++i) ++positions[slot_source_[i]];
  }
  return positions;
}

StatusOr<MicroBatch> Mixture::MakeBatch(int64_t first, int64_t count, bool shuffle, uint64_t seed) const {
  if (sources_.size() == 1) return sources_[0].data->MakeBatch(first, count, shuffle, seed);
  std::vector<std::unique_ptr<std::ifstream>> files(sources_.size());
  std::vector<BatchRow> rows;
  std::vector<int64_t> data_rows;
  for (int64_t b = 0; b < count; ++b) {
    const Slot slot = At(first + b, shuffle, seed);
    const Dataset& data = *sources_[slot.source].data;
    if (!files[slot.source]) {
      FT_ASSIGN_OR_RETURN(files[slot.source], data.OpenForReading());
    }
    FT_RETURN_IF_ERROR(data.ReadRow(*files[slot.source], slot.row, &rows));
    data_rows.push_back(slot.row);
  }
  MicroBatch mb = AssembleBatch(rows, sources_[0].data->packing());
  mb.first_sequence = first * (sources_[0].data->pairs() ? 2 : 1);
  mb.data_rows = std::move(data_rows);
  return mb;
}

int64_t Mixture::CountTargets(int64_t first, int64_t count, bool shuffle, uint64_t seed) const {
  if (sources_.size() == 1) return sources_[0].data->CountTargets(first, count, shuffle, seed);
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) {
    const Slot slot = At(first + i, shuffle, seed);
    total += sources_[slot.source].data->RowTargets(slot.row);
  }
  return total;
}

uint64_t Mixture::file_bytes() const {
  uint64_t bytes = 0;
  for (const MixtureSource& s : sources_) bytes += s.data->file_bytes();
  return bytes;
}

Status Mixture::CheckUnchanged() const {
  for (const MixtureSource& s : sources_) FT_RETURN_IF_ERROR(s.data->CheckUnchanged());
  return Status::OK();
}

}  // namespace ft
