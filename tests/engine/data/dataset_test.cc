// The data pipeline's order, index cache and packing: a restored cursor
// continues the exact stream (across epochs, with another micro-batch size),
// and packed rows give each document the loss it has alone.
#include "engine/data/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "common/file_util.h"
#include "engine/data/data_format.h"
#include "engine/io/hf_model.h"
#include "engine/model/rng.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

std::string WriteData(const std::string& name, int lines) {
  const std::string dir = (fs::path(testing::TempDir()) / ("dataset-" + name)).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream out(dir + "/d.jsonl");
  for (int i = 0; i < lines; ++i) {
    out << "{\"input_ids\": [";
    const int n = 3 + static_cast<int>(HashKeys(1, i) % 20);
    for (int t = 0; t < n; ++t) out << (t ? ", " : "") << (HashKeys(2, i, t) % 250) + 1;
    out << "]}\n";
    if (i % 7 == 3) out << "\n";  // blank lines are not examples
  }
  return dir + "/d.jsonl";
}

std::unique_ptr<Dataset> Open(const std::string& path, bool packing, int64_t seq_len = 32,
                              bool cache = true) {
  auto ds = Dataset::Open(
      {path, seq_len, packing, false, "test", cache},
      [](const std::string& line, const std::string& where) { return ParseTokensRecord(line, where, 256); });
  EXPECT_TRUE(ds.ok()) << ds.status().ToString();
  return std::move(*ds);
}

// The ids of every row from cursor `from` to `to`, fetched `micro` rows at a time.
std::vector<std::vector<int32_t>> Stream(const Dataset& ds, int64_t from, int64_t to, int64_t micro,
                                         bool shuffle) {
  std::vector<std::vector<int32_t>> rows;
  for (int64_t c = from; c < to; c += micro) {
    const int64_t n = std::min(micro, to - c);
    auto mb = ds.MakeBatch(c, n, shuffle, 42);
    EXPECT_TRUE(mb.ok());
    for (int64_t b = 0; b < n; ++b) {
      std::vector<int32_t> row(mb->ids.begin() + b * mb->seq, mb->ids.begin() + (b + 1) * mb->seq);
      while (!row.empty() && row.back() == 0) row.pop_back();  // drop padding
      rows.push_back(row);
    }
  }
  return rows;
}

TEST(DatasetOrderTest, RestoredCursorContinuesTheSameStreamAcrossEpochsAndPlans) {
  const std::string path = WriteData("order", 30);
  auto ds = Open(path, false);
  ASSERT_EQ(ds->size(), 30);
  // Uninterrupted: 3 epochs, 4 rows at a time.
  auto want = Stream(*ds, 0, 90, 4, true);
  // Interrupted at cursor 26 (mid-epoch 0... and later crossing the boundary at 30),
  // resumed by a fresh process (new Dataset from the cached index) fetching 3 rows at a time.
  auto got = Stream(*ds, 0, 26, 4, true);
  auto resumed = Open(path, false);
  EXPECT_TRUE(resumed->from_cache());
  auto rest = Stream(*resumed, 26, 90, 3, true);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, want);
  // Each epoch is a permutation of all rows, and epochs differ.
  auto e0 = std::vector(want.begin(), want.begin() + 30),
       e1 = std::vector(want.begin() + 30, want.begin() + 60);
  EXPECT_NE(e0, e1);
  std::sort(e0.begin(), e0.end());
  std::sort(e1.begin(), e1.end());
  EXPECT_EQ(e0, e1);
}

TEST(DatasetIndexTest, CacheIsReusedAndRebuiltWhenTheDataChanges) {
  const std::string path = WriteData("cache", 10);
  EXPECT_FALSE(Open(path, false)->from_cache());
  EXPECT_TRUE(Open(path, false)->from_cache());
  EXPECT_FALSE(Open(path, false, 16)->from_cache()) << "another seq_len is another key";
  std::ofstream(path, std::ios::app) << "{\"input_ids\": [5, 6, 7]}\n";
  auto changed = Open(path, false, 16);
  EXPECT_FALSE(changed->from_cache()) << "content hash changed";
  EXPECT_EQ(changed->examples(), 11);
}

// The fields of line record `line` in an .ftidx (engine/data/dataset.cc's layout).
struct IndexFields {
  std::string bytes;
  size_t lines_at = 0;  // where the first line record starts; the count is the 8 bytes before
  template <typename T>
  void Set(size_t at, T v) {
    std::memcpy(bytes.data() + at, &v, sizeof(T));
  }
  void SetCount(uint64_t count) { Set(lines_at - 8, count); }
  void SetOffset(int line, uint64_t v) { Set(lines_at + line * 20, v); }
  void SetTokens(int line, int32_t v) { Set(lines_at + line * 20 + 12, v); }
  void SetTargets(int line, int32_t v) { Set(lines_at + line * 20 + 16, v); }
  int32_t Tokens(int line) const {
    int32_t v = 0;
    std::memcpy(&v, bytes.data() + lines_at + line * 20 + 12, sizeof(v));
    return v;
  }
};

// Rewrites the cached index of `path` with `edit` applied; its trailing checksum is
// recomputed unless `fix_checksum` is false (so that the field checks, not the checksum, catch it).
void EditIndex(const std::string& path, const std::function<void(IndexFields*)>& edit,
               bool fix_checksum = true) {
  IndexFields f;
  f.bytes = *ReadFileToString(path + ".ftidx");
  size_t at = 8;
  for (int s = 0; s < 2; ++s) {  // the data's SHA-256 and the cache key, each after its u32 length
    uint32_t len = 0;
    std::memcpy(&len, f.bytes.data() + at, sizeof(len));
    at += sizeof(len) + len;
  }
  f.lines_at = at + 8;
  edit(&f);
  const bool checksummed = f.bytes.compare(0, 8, "FTIDX002") == 0;
  if (fix_checksum && checksummed) {
    f.bytes.resize(f.bytes.size() - 64);
    f.bytes += Sha256Hex(f.bytes);
  }
  ASSERT_TRUE(ReplaceFileAtomically(path + ".ftidx", f.bytes).ok());
}

// Opens `path` after `edit` damaged its index: the index must be rebuilt, with the counts of the data.
void ExpectRebuilt(const std::string& path, const std::function<void(IndexFields*)>& edit,
                   bool fix_checksum = true) {
  const auto good = Open(path, false);
  const int64_t targets = good->CountTargets(0, good->size(), false, 0);
  EditIndex(path, edit, fix_checksum);
  auto reopened = Open(path, false);
  ASSERT_NE(reopened, nullptr);
  EXPECT_FALSE(reopened->from_cache()) << "a damaged index was used";
  EXPECT_EQ(reopened->examples(), good->examples());
  EXPECT_EQ(reopened->CountTargets(0, reopened->size(), false, 0), targets);
  EXPECT_TRUE(Open(path, false)->from_cache()) << "the rebuilt index is cached again";
}

TEST(DatasetIndexTest, AHugeLineCountIsRebuiltInsteadOfAborting) {
  // Was: std::vector(count) threw length_error and ft-train aborted (rc 134).
  const std::string path = WriteData("huge-count", 10);
  ExpectRebuilt(path, [](IndexFields* f) { f->SetCount(uint64_t{1} << 62); });
  ExpectRebuilt(path, [](IndexFields* f) { f->SetCount(11); });
}

TEST(DatasetIndexTest, NegativeOrImpossibleCountsAreRebuilt) {
  // Was: negative targets trained to a negative loss and the job reported "finished".
  const std::string path = WriteData("negative", 10);
  ExpectRebuilt(path, [](IndexFields* f) { f->SetTargets(0, -1000); });
  ExpectRebuilt(path, [](IndexFields* f) { f->SetTokens(1, -7); });
  ExpectRebuilt(path, [](IndexFields* f) { f->SetTokens(2, 1 << 30); });
  ExpectRebuilt(path, [](IndexFields* f) { f->SetTargets(3, f->Tokens(3)); });
}

TEST(DatasetIndexTest, OffsetsBeyondTheFileOrOutOfOrderAreRebuilt) {
  const std::string path = WriteData("offsets", 10);
  ExpectRebuilt(path, [&](IndexFields* f) { f->SetOffset(9, fs::file_size(path) + 100); });
  ExpectRebuilt(path, [](IndexFields* f) { f->SetOffset(4, 0); });
}

TEST(DatasetIndexTest, AnIndexFailingItsChecksumIsRebuilt) {
  // A plausible but different token count, the checksum left as it was.
  const std::string path = WriteData("checksum", 10);
  ExpectRebuilt(
      path, [](IndexFields* f) { f->SetTokens(0, f->Tokens(0) - 1); }, /*fix_checksum=*/false);
}

TEST(DatasetIndexTest, AnIndexThatDisagreesWithTheDataIsRemovedSoARestartReindexes) {
  // Every field plausible and the checksum right, but line 0's token count is not the data's:
  // reading it fails, and the next open (a restart) must re-index rather than load it again.
  const std::string path = WriteData("lying", 10);
  Open(path, false);
  EditIndex(path, [](IndexFields* f) {
    f->SetTokens(0, f->Tokens(0) - 1);
    f->SetTargets(0, 0);
  });
  auto lying = Open(path, false);
  ASSERT_TRUE(lying->from_cache());
  auto batch = lying->MakeBatch(0, lying->size(), false, 0);
  ASSERT_FALSE(batch.ok());
  EXPECT_THAT(batch.status().message(), ::testing::HasSubstr("its index was removed: restart to re-index"));
  auto restarted = Open(path, false);
  EXPECT_FALSE(restarted->from_cache()) << "the restart loaded the same index again";
  EXPECT_TRUE(restarted->MakeBatch(0, restarted->size(), false, 0).ok());
}

// A file rewritten while Open indexed it used to get an index of a mix, cached under the hash of
// the file before: now Open fails naming both hashes.
TEST(DatasetIdentityTest, AFileChangedWhileItIsIndexedIsRefusedNamingBothHashes) {
  const std::string path = WriteData("changed-while-indexed", 10);
  const std::string before = *Sha256File(path);
  bool rewritten = false;
  auto ds = Dataset::Open(
      {path, 32, false, false, "test", true}, [&](const std::string& line, const std::string& where) {
        if (!rewritten) {  // in place, same size: the last byte of the first line's first id
          rewritten = true;
          std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
          f.seekp(static_cast<std::streamoff>(line.find(',') - 1));
          f.put(line[line.find(',') - 1] == '1' ? '2' : '1');
        }
        return ParseTokensRecord(line, where, 256);
      });
  ASSERT_TRUE(ds.status().IsInvalidArgument()) << ds.status().ToString();
  EXPECT_THAT(ds.status().message(),
              ::testing::HasSubstr(path + " changed during the run: SHA-256 " + before + " at start, " +
                                   *Sha256File(path) + " now"));
  EXPECT_FALSE(fs::exists(path + ".ftidx")) << "no index of a mix is cached";
}

// A line that no longer reads as it did when indexed names the change (both hashes) when the file
// changed: bad input, where it used to be a "changed since indexed" failure that was retried.
TEST(DatasetIdentityTest, ABatchOfAFileChangedSinceOpenNamesBothHashes) {
  const std::string path = WriteData("changed-since-open", 10);
  auto ds = Open(path, false);
  const std::string before = ds->sha256();
  std::string text = *ReadFileToString(path);
  std::ofstream(path, std::ios::binary) << "{\"input_ids\": [7, 7, 7]}\n" << text;  // every line moves
  auto batch = ds->MakeBatch(0, ds->size(), false, 0);
  ASSERT_TRUE(batch.status().IsInvalidArgument()) << batch.status().ToString();
  EXPECT_THAT(batch.status().message(),
              ::testing::HasSubstr(path + " changed during the run: SHA-256 " + before + " at start, " +
                                   *Sha256File(path) + " now"));
}

TEST(DatasetPackingTest, RowsHoldWholeDocumentsWithRestartingPositionsAndSegments) {
  const std::string path = WriteData("pack", 40);
  auto plain = Open(path, false), packed = Open(path, true);
  EXPECT_LT(packed->size(), plain->size());
  EXPECT_EQ(packed->CountTargets(0, packed->size(), false, 0),
            plain->CountTargets(0, plain->size(), false, 0))
      << "packing never adds or drops a target";
  auto mb = packed->MakeBatch(0, 1, false, 0);
  ASSERT_TRUE(mb.ok());
  ASSERT_LE(mb->seq, 32);
  int documents = 0;
  for (int64_t t = 0; t < mb->seq; ++t) {
    if (mb->segments[t] < 0) break;  // padding
    if (mb->positions[t] == 0) {
      EXPECT_EQ(mb->segments[t], documents++);
      if (t > 0) {
        EXPECT_EQ(mb->targets[t - 1], -100) << "no target crosses a document boundary";
      }
    }
  }
  EXPECT_GE(documents, 2);
}

TEST(DatasetPackingTest, PackedDocumentsHaveTheLossTheyHaveAlone) {
  const std::string path = WriteData("packloss", 24);
  auto plain = Open(path, false, 64), packed = Open(path, true, 64);
  ModelConfig c = *PresetModelConfig("tiny-llama");
  Model model(c, {});
  RandomInitModel(&model, 21);
  double packed_sum = 0, alone_sum = 0;
  int64_t packed_tokens = 0, alone_tokens = 0;
  for (int64_t r = 0; r < packed->size(); ++r) {
    auto mb = packed->MakeBatch(r, 1, false, 0);
    LossResult l = model.Forward(*mb, nullptr);
    packed_sum += l.loss_sum;
    packed_tokens += l.tokens;
  }
  for (int64_t e = 0; e < plain->size(); ++e) {
    auto mb = plain->MakeBatch(e, 1, false, 0);
    LossResult l = model.Forward(*mb, nullptr);
    alone_sum += l.loss_sum;
    alone_tokens += l.tokens;
  }
  EXPECT_EQ(packed_tokens, alone_tokens);
  std::printf("loss sum packed %.9f, documents alone %.9f (%lld rows vs %lld)\n", packed_sum, alone_sum,
              static_cast<long long>(packed->size()), static_cast<long long>(plain->size()));
  EXPECT_NEAR(packed_sum, alone_sum, 1e-5 * alone_sum);
  // Per document: logits of the second document of the first packed row equal those of it alone.
  auto row = packed->MakeBatch(0, 1, false, 0);
  std::vector<float> packed_logits, alone_logits;
  model.Forward(*row, &packed_logits);
  int64_t start = 0;
  while (row->segments[start] == 0) ++start;
  auto second = plain->MakeBatch(1, 1, false, 0);
  model.Forward(*second, &alone_logits);
  double maxdiff = 0;
  for (size_t i = 0; i < alone_logits.size(); ++i) {
    maxdiff = std::max(
        maxdiff, static_cast<double>(std::fabs(packed_logits[start * c.vocab_size + i] - alone_logits[i])));
  }
  EXPECT_LT(maxdiff, 1e-5);
}

// Preference pairs (DatasetOptions::pairs): a data row is one pair; a micro-batch of n rows holds
// 2n sequences, pair i's chosen at batch row 2i and its rejected at 2i + 1, targets on the
// responses only; the index counts both sequences' targets and is reused; first_sequence counts
// sequences.
TEST(DatasetPairsTest, EachPairIsTwoBatchRowsWithTargetsOnTheResponses) {
  const std::string dir = (fs::path(testing::TempDir()) / "dataset-pairs").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream out(dir + "/p.jsonl");
    out << R"({"prompt_ids": [1, 2], "chosen_ids": [3, 4, 5], "rejected_ids": [6]})"
        << "\n"
        << R"({"prompt_ids": [7], "chosen_ids": [8], "rejected_ids": [9, 10]})"
        << "\n";
  }
  StatusOr<RecordEncoder> encode = MakeRecordEncoder(DataFormat::kPreference, nullptr, 256, {}, {4, 16});
  ASSERT_TRUE(encode.ok()) << encode.status().ToString();
  for (bool cached : {false, true}) {
    DatasetOptions options{dir + "/p.jsonl", 16, false, false, "pairs-test", true};
    options.pairs = true;
    auto ds = Dataset::Open(options, *encode);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    EXPECT_EQ((*ds)->from_cache(), cached);
    EXPECT_EQ((*ds)->size(), 2);
    EXPECT_EQ((*ds)->CountTargets(0, 2, false, 0), 4 + 3);  // 3 + 1 and 1 + 2 response tokens
    auto mb = (*ds)->MakeBatch(0, 2, false, 0);
    ASSERT_TRUE(mb.ok()) << mb.status().ToString();
    EXPECT_EQ(mb->batch, 4);
    EXPECT_EQ(mb->seq, 5);
    EXPECT_EQ(mb->first_sequence, 0);
    const std::vector<int32_t> ids = {1,      2, 3, 4, 5, /**/ 1, 2, 6,  0, 0,
                                      /**/ 7, 8, 0, 0, 0, /**/ 7, 9, 10, 0, 0};
    EXPECT_EQ(mb->ids, ids);
    const std::vector<int32_t> targets = {-100, 3,    4,    5,    -100, -100, 6,  -100, -100, -100,
                                          8,    -100, -100, -100, -100, 9,    10, -100, -100, -100};
    EXPECT_EQ(mb->targets, targets);
    EXPECT_EQ((*ds)->MakeBatch(1, 1, false, 0)->first_sequence, 2);
  }
}

}  // namespace
}  // namespace ft
