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

}  // namespace
}  // namespace ft
