// Mixtures of data sources (engine/data/mixture.h): the shares they realise,
// an order that is a pure function of the cursor (however the rows are
// fetched: one batch, or the micro-batches of world 1 or 2 ranks, or after a
// reopen), the source positions a checkpoint records, and data.val_fraction's
// split by row content, unmoved by an append.
#include "engine/data/mixture.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "engine/data/data_format.h"
#include "engine/model/rng.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

// <dir>/<name>.jsonl: `lines` rows of token ids whose first id says the source (tag) and the
// second and third the row's number, so every row of every source is told apart by its ids.
std::string WriteSource(const std::string& dir, const std::string& name, int tag, int lines, int first = 0) {
  fs::create_directories(dir);
  std::ofstream out(dir + "/" + name + ".jsonl", first == 0 ? std::ios::trunc : std::ios::app);
  for (int i = first; i < first + lines; ++i) {
    out << "{\"input_ids\": [" << tag << ", " << 1 + i % 200 << ", " << 1 + i / 200;
    const int n = static_cast<int>(HashKeys(tag, i) % 6);
    for (int t = 0; t < n; ++t) out << ", " << HashKeys(tag, i, t) % 250 + 1;
    out << "]}\n";
  }
  return dir + "/" + name + ".jsonl";
}

std::string FreshDir(const std::string& name) {
  const std::string dir = (fs::path(testing::TempDir()) / ("mixture-" + name)).string();
  fs::remove_all(dir);
  return dir;
}

std::unique_ptr<Dataset> OpenSource(const std::string& path, double holdout = 0, bool held_out = false) {
  DatasetOptions options;
  options.path = path;
  options.seq_len = 32;
  options.cache_key = "test";
  options.holdout = holdout;
  options.held_out = held_out;
  auto ds = Dataset::Open(options, [](const std::string& line, const std::string& where) {
    return ParseTokensRecord(line, where, 256);
  });
  EXPECT_TRUE(ds.ok()) << ds.status().ToString();
  return ds.ok() ? std::move(*ds) : nullptr;
}

// Sources a, b, c (tags 1, 2, 3; 500, 120 and 2000 rows) mixed 0.6 / 0.3 / 0.1.
std::unique_ptr<Mixture> ThreeSources(const std::string& dir, std::vector<double> weights = {0.6, 0.3, 0.1},
                                      bool epochs = false) {
  const int rows[] = {500, 120, 2000};
  std::vector<MixtureSource> sources;
  for (int k = 0; k < 3; ++k) {
    const std::string name(1, static_cast<char>('a' + k));
    MixtureSource s{OpenSource(WriteSource(dir, name, k + 1, rows[k])), epochs ? 0 : weights[k],
                    epochs ? weights[k] : 0, "data.train[" + std::to_string(k) + "]"};
    sources.push_back(std::move(s));
  }
  auto m = Mixture::Create(std::move(sources), Mixture::Mode::kInterleave);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

// Each row's ids (padding dropped) from cursor `from` to `to`, fetched as the ranks of a
// `world`-rank job fetch a global batch of `global` rows in micro-batches of `micro`.
std::vector<std::vector<int32_t>> Rows(const Mixture& m, int64_t from, int64_t to, int64_t global,
                                       int64_t micro, int world) {
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(to - from));
  for (int64_t step = from; step < to; step += global) {
    for (int rank = 0; rank < world; ++rank) {
      const int64_t per_rank = global / world;
      for (int64_t a = 0; a * micro < per_rank; ++a) {
        const int64_t first = step + rank * per_rank + a * micro;
        auto mb = m.MakeBatch(first, micro, /*shuffle=*/true, 42);
        EXPECT_TRUE(mb.ok()) << mb.status().ToString();
        if (!mb.ok()) return rows;
        for (int64_t b = 0; b < micro; ++b) {
          std::vector<int32_t> row(mb->ids.begin() + b * mb->seq, mb->ids.begin() + (b + 1) * mb->seq);
          while (!row.empty() && row.back() == 0) row.pop_back();
          rows[first + b - from] = row;
        }
      }
    }
  }
  return rows;
}

TEST(MixtureTest, ThreeSourcesRealiseTheirWeightsWithinOnePercentOverTenThousandRows) {
  auto m = ThreeSources(FreshDir("weights"));
  ASSERT_TRUE(m);
  std::map<int, int64_t> counts;
  std::set<std::pair<int, int64_t>> seen_rows;
  for (int64_t c = 0; c < 10000; ++c) {
    const Mixture::Slot slot = m->At(c, true, 42);
    ++counts[slot.source];
    seen_rows.emplace(slot.source, slot.row);
  }
  const double want[] = {0.6, 0.3, 0.1};
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(counts[k] / 10000.0, want[k], 0.01) << "source " << k;
    std::printf("source %d: %.4f of 10000 rows (weight %.1f)\n", k, counts[k] / 10000.0, want[k]);
  }
  // Every row of the small source b is used before any repeats (its own shuffled epochs).
  int64_t b_rows = 0;
  for (const auto& [source, row] : seen_rows) b_rows += source == 1;
  EXPECT_EQ(b_rows, 120);
  // Every prefix, not only the whole: shares hold within a block's rounding from early on.
  for (int64_t n : {100, 1000}) {
    int64_t a = 0;
    for (int64_t c = 0; c < n; ++c) a += m->At(c, true, 42).source == 0;
    EXPECT_NEAR(static_cast<double>(a) / n, 0.6, 0.011) << "first " << n << " rows";
  }
}

TEST(MixtureTest, TheOrderIsThePureFunctionOfTheCursorAtAnyWorldSizeAndAfterAReopen) {
  const std::string dir = FreshDir("order");
  auto m = ThreeSources(dir);
  ASSERT_TRUE(m);
  const auto whole = Rows(*m, 0, 480, 480, 480, 1);
  EXPECT_EQ(Rows(*m, 0, 480, 16, 2, 1), whole) << "world 1, micro-batches of 2";
  EXPECT_EQ(Rows(*m, 0, 480, 16, 4, 2), whole) << "world 2, micro-batches of 4";
  // A resume: the sources reopened (their indexes from the cache) and read from a cursor on.
  m.reset();
  auto resumed = ThreeSources(dir);
  ASSERT_TRUE(resumed);
  const auto tail = Rows(*resumed, 240, 480, 16, 8, 2);
  EXPECT_EQ(tail, std::vector<std::vector<int32_t>>(whole.begin() + 240, whole.end())) << "after a reopen";
  // The rows are the mixture's: each source's tag, in the slots the schedule gives it.
  for (size_t c = 0; c < whole.size(); ++c) {
    ASSERT_FALSE(whole[c].empty());
    EXPECT_EQ(whole[c][0], resumed->At(static_cast<int64_t>(c), true, 42).source + 1) << "row " << c;
  }
}

TEST(MixtureTest, PositionsCountEachSourcesRowsBeforeTheCursor) {
  auto m = ThreeSources(FreshDir("positions"));
  ASSERT_TRUE(m);
  std::vector<int64_t> counted(3, 0);
  for (int64_t c = 0; c <= 9000; ++c) {
    if (c % 1500 == 0) {
      EXPECT_EQ(m->Positions(c), counted) << "cursor " << c;
    }
    if (c < 9000) ++counted[m->At(c, false, 0).source];
  }
  EXPECT_EQ(m->Positions(m->block()), (std::vector<int64_t>{m->quota(0), m->quota(1), m->quota(2)}));
}

TEST(MixtureTest, EpochsCountEachSourceByItsRowsAndConcatenationReadsEachWhole) {
  const std::string dir = FreshDir("epochs");
  auto m = ThreeSources(dir, {1, 2, 0.5}, /*epochs=*/true);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->size(), 500 + 2 * 120 + 1000) << "a pass of the mixture: epochs x rows, summed";
  std::vector<int64_t> counts(3, 0);
  for (int64_t c = 0; c < m->size(); ++c) ++counts[m->At(c, true, 7).source];
  EXPECT_NEAR(counts[0], 500, 3);
  EXPECT_NEAR(counts[1], 240, 3);
  EXPECT_NEAR(counts[2], 1000, 3);

  std::vector<MixtureSource> one;  // a single source keeps its own order; epochs set a pass's rows
  one.push_back({OpenSource(dir + "/b.jsonl"), 0, 2.5, "data.train[0]"});
  auto single = Mixture::Create(std::move(one), Mixture::Mode::kInterleave);
  ASSERT_TRUE(single.ok());
  EXPECT_EQ((*single)->size(), 300);
  EXPECT_EQ((*single)->At(130, true, 7).row, (*single)->source(0).RowAt(130, true, 7));

  std::vector<MixtureSource> eval;
  eval.push_back({OpenSource(dir + "/b.jsonl"), 1, 0, "data.eval[0]"});
  eval.push_back({OpenSource(dir + "/a.jsonl"), 1, 0, "data.eval[1]"});
  auto whole = Mixture::Create(std::move(eval), Mixture::Mode::kConcatenate);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ((*whole)->size(), 620);
  for (int64_t c : {0, 119, 120, 619}) {
    const Mixture::Slot s = (*whole)->At(c, false, 0);
    EXPECT_EQ(s.source, c < 120 ? 0 : 1);
    EXPECT_EQ(s.row, c < 120 ? c : c - 120) << "file order, one source after the other";
  }
}

TEST(MixtureTest, AShareTooSmallForABlockIsRefusedNamingTheSource) {
  const std::string dir = FreshDir("tiny-share");
  std::vector<MixtureSource> sources;
  sources.push_back({OpenSource(WriteSource(dir, "big", 1, 50)), 1e7, 0, "data.train[0]"});
  sources.push_back({OpenSource(WriteSource(dir, "small", 2, 50)), 1, 0, "data.train[1]"});
  auto m = Mixture::Create(std::move(sources), Mixture::Mode::kInterleave);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), testing::HasSubstr("data.train[1]: its share"));
}

// The ids of every example of `ds`, in file order (the rows' second and third ids).
std::set<std::vector<int32_t>> Examples(const Dataset& ds) {
  std::set<std::vector<int32_t>> all;
  auto mb = ds.MakeBatch(0, ds.size(), false, 0);
  EXPECT_TRUE(mb.ok());
  for (int64_t b = 0; mb.ok() && b < mb->batch; ++b) {
    std::vector<int32_t> row(mb->ids.begin() + b * mb->seq, mb->ids.begin() + (b + 1) * mb->seq);
    while (!row.empty() && row.back() == 0) row.pop_back();
    all.insert(row);
  }
  return all;
}

TEST(MixtureTest, AValFractionHoldsOutTheSameRowsAfterAnAppend) {
  const std::string dir = FreshDir("holdout");
  const std::string path = WriteSource(dir, "d", 1, 2000);
  const auto train = Examples(*OpenSource(path, 0.05, false));
  const auto held = Examples(*OpenSource(path, 0.05, true));
  EXPECT_EQ(train.size() + held.size(), 2000u) << "the two sides partition the rows";
  EXPECT_NEAR(held.size() / 2000.0, 0.05, 0.015);
  for (const auto& row : held) EXPECT_EQ(train.count(row), 0u) << "a held-out row is never trained on";
  WriteSource(dir, "d", 1, 500, /*first=*/2000);  // appended rows
  const auto train_after = Examples(*OpenSource(path, 0.05, false));
  const auto held_after = Examples(*OpenSource(path, 0.05, true));
  for (const auto& row : held) EXPECT_EQ(held_after.count(row), 1u) << "a held-out row stays held out";
  for (const auto& row : train) EXPECT_EQ(train_after.count(row), 1u) << "a training row stays in training";
  EXPECT_GT(held_after.size(), held.size()) << "appended rows are split too";
}

}  // namespace
}  // namespace ft
