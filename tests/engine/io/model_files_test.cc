// Model files from untrusted directories: index.json shard names stay inside
// the model directory, safetensors errors never echo file bytes, and with
// allowed roots a symlink out of them is refused when the weights are opened.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/confined_path.h"
#include "common/file_util.h"
#include "engine/io/hf_model.h"
#include "engine/io/peft_adapter.h"
#include "engine/io/safetensors.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class ModelFilesTest : public testing::Test {
 protected:
  void SetUp() override {
    base_ = (fs::path(testing::TempDir()) /
             ("model-files-" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name())))
                .string();
    fs::remove_all(base_);
    fs::create_directories(base_);
  }
  void TearDown() override { SetProcessAllowedRoots({}); }
  // A tiny model with random weights in <base>/<name>.
  std::string MakeModel(const std::string& name, uint64_t seed = 7) {
    const std::string dir = base_ + "/" + name;
    Model model(*PresetModelConfig("tiny-llama"), {});
    RandomInitModel(&model, seed);
    EXPECT_TRUE(SaveHfModel(dir, model, DType::kF32).ok());
    return dir;
  }
  // Replaces <dir>/model.safetensors with an index mapping every tensor to `shard`.
  void IndexEveryTensorTo(const std::string& dir, const std::string& shard) {
    auto file = SafetensorsFile::Open(dir + "/model.safetensors");
    ASSERT_TRUE(file.ok());
    nlohmann::json map;
    for (const TensorInfo& t : (*file)->tensors()) map[t.name] = shard;
    std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  }
  Status Load(const std::string& dir) {
    Model model(*ReadHfConfig(dir), {});
    return LoadHfWeights(dir, &model);
  }

  std::string base_;
};

TEST_F(ModelFilesTest, IndexShardWithDotDotIsRefusedNamingIndexTensorAndValue) {
  const std::string dir = MakeModel("m");
  IndexEveryTensorTo(dir, "../../x");
  Status s = Load(dir);
  ASSERT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(dir + "/model.safetensors.index.json: weight_map['"));
  EXPECT_THAT(s.message(),
              HasSubstr("'] = '../../x': a shard must be a file name inside the model directory"));
}

TEST_F(ModelFilesTest, IndexShardAtAnotherModelsAbsolutePathIsNotTrainedFrom) {
  const std::string other = MakeModel("other", 99);
  const std::string dir = MakeModel("m");
  IndexEveryTensorTo(dir, other + "/model.safetensors");  // a valid shard, of another model
  Status s = Load(dir);
  ASSERT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("'" + other + "/model.safetensors': a shard must be a file name"));
}

TEST_F(ModelFilesTest, IndexShardInASubdirectoryOfTheModelLoads) {
  const std::string dir = MakeModel("m");
  fs::create_directories(dir + "/shards");
  fs::rename(dir + "/model.safetensors", dir + "/shards/part-1.safetensors");
  fs::create_symlink("shards/part-1.safetensors", dir + "/model.safetensors");  // for IndexEveryTensorTo
  IndexEveryTensorTo(dir, "shards/part-1.safetensors");
  Status s = Load(dir);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(ModelFilesTest, ImplausibleHeaderLengthDoesNotEchoTheFilesFirstBytes) {
  const std::string path = base_ + "/not-safetensors";
  std::ofstream(path, std::ios::binary) << "SECRET-PASSWORD=hunter2";
  uint64_t as_number = 0;
  std::memcpy(&as_number, "SECRET-P", 8);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.status().IsCorruption()) << f.status().ToString();
  EXPECT_THAT(f.status().message(), HasSubstr("implausible for a file of 23 bytes"));
  EXPECT_THAT(f.status().message(), Not(HasSubstr(std::to_string(as_number))));
}

TEST_F(ModelFilesTest, WeightsSymlinkedOutOfTheRootAreRefusedWithRoots) {
  const std::string outside = MakeModel("outside");
  const std::string root = base_ + "/root";
  const std::string dir = MakeModel("root/m");
  fs::remove(dir + "/model.safetensors");
  fs::create_symlink(outside + "/model.safetensors", dir + "/model.safetensors");
  EXPECT_TRUE(Load(dir).ok());  // no roots: symlinks are followed as ever
  SetProcessAllowedRoots({root});
  Status s = Load(dir);
  ASSERT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(dir + "/model.safetensors: resolves to " + outside));
  EXPECT_THAT(s.message(), HasSubstr("outside the allowed roots (" + root + ")"));
}

TEST_F(ModelFilesTest, FifoAsWeightsFileIsRefusedWithoutBlocking) {
  const std::string dir = MakeModel("m");
  fs::remove(dir + "/model.safetensors");
  ASSERT_EQ(::mkfifo((dir + "/model.safetensors").c_str(), 0600), 0);
  auto f = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(f.status().IsInvalidArgument()) << f.status().ToString();
  EXPECT_THAT(f.status().message(), HasSubstr("is a FIFO, not a regular file"));
}

// A hand-made safetensors file: the header text as given (repeats and all), then `data_bytes` zeros.
void WriteRawSafetensors(const std::string& path, const std::string& header, size_t data_bytes) {
  const uint64_t n = header.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << std::string(data_bytes, '\0');
}

// JSON keeps the last of a repeated key, so a file naming a tensor twice used to load whichever
// entry came last, silently.
TEST_F(ModelFilesTest, ATensorNamedTwiceIsRefusedNamingItAndBothEntries) {
  const std::string path = base_ + "/twice.safetensors";
  WriteRawSafetensors(path,
                      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                      16);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.status().IsCorruption()) << f.status().ToString();
  EXPECT_THAT(f.status().message(),
              HasSubstr(path + ": tensor 'w' is named twice in the header (data_offsets [0,8] and [8,16])"));
}

// Two tensors over the same bytes used to load, each reading the other's values.
TEST_F(ModelFilesTest, TensorsSharingBytesAreRefusedNamingBothAndTheirRanges) {
  const std::string path = base_ + "/overlap.safetensors";
  WriteRawSafetensors(path,
                      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                      R"("empty":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                      16);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.status().IsCorruption()) << f.status().ToString();
  EXPECT_THAT(f.status().message(),
              HasSubstr(path + ": tensors 'a' (data_offsets [0, 16)) and 'b' ([8, 16)) share bytes"));
  // Side by side they load; an empty tensor holds no bytes to share.
  WriteRawSafetensors(path,
                      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("empty":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                      16);
  EXPECT_TRUE(SafetensorsFile::Open(path).ok());
}

// 2^62 x 8 floats is 2^67 bytes, 0 modulo 2^64: the count wrapped and such a tensor opened.
TEST_F(ModelFilesTest, AShapeWhoseByteCountOverflowsIsRefused) {
  const std::string path = base_ + "/huge.safetensors";
  WriteRawSafetensors(path, R"({"h":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,0]}})",
                      0);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.status().IsCorruption()) << f.status().ToString();
  EXPECT_THAT(f.status().message(), HasSubstr(path + ": tensor 'h': F32 [4611686018427387904, 8] needs more "
                                                     "bytes than the file's 0 data bytes"));
}

// A weight_map naming a tensor twice (JSON keeps the last) and a tensor that two shards hold both
// left which bytes load to chance.
TEST_F(ModelFilesTest, AnIndexNamingATensorTwiceIsRefused) {
  const std::string dir = MakeModel("m");
  IndexEveryTensorTo(dir, "model.safetensors");
  std::string index = *ReadFileToString(dir + "/model.safetensors.index.json");
  index.insert(index.rfind('}') - 1, R"(,"lm_head.weight":"other.safetensors")");
  std::ofstream(dir + "/model.safetensors.index.json") << index;
  Status s = Load(dir);
  ASSERT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(dir + "/model.safetensors.index.json: weight_map names tensor "
                                           "'lm_head.weight' twice (\"model.safetensors\" and "
                                           "\"other.safetensors\")"));
}

TEST_F(ModelFilesTest, ATensorThatTwoShardsHoldIsRefused) {
  const std::string dir = MakeModel("m");
  fs::copy_file(dir + "/model.safetensors", dir + "/a.safetensors");
  fs::rename(dir + "/model.safetensors", dir + "/b.safetensors");
  nlohmann::json map;
  auto file = SafetensorsFile::Open(dir + "/a.safetensors");
  ASSERT_TRUE(file.ok());
  for (const TensorInfo& t : (*file)->tensors())
    map[t.name] = t.name < "model.layers.1" ? "a.safetensors" : "b.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  Status s = Load(dir);
  ASSERT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(dir + "/model.safetensors.index.json: tensor '"));
  EXPECT_THAT(s.message(), HasSubstr("' is in two shards, a.safetensors and b.safetensors"));
}

}  // namespace
}  // namespace ft
