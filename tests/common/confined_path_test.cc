// Path confinement at open time and bounded whole-file reads
// (common/confined_path.h, common/file_util.h).
#include "common/confined_path.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>

#include "common/file_util.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class ConfinedPathTest : public testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::path(testing::TempDir()) /
            ("confined-" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(base_);
    root_ = (base_ / "root").string();
    outside_ = (base_ / "outside").string();
    fs::create_directories(root_);
    fs::create_directories(outside_);
    std::ofstream(outside_ + "/secret") << "top secret";
  }
  void TearDown() override { SetProcessAllowedRoots({}); }
  bool OutsideHolds(const std::string& name) { return fs::exists(fs::path(outside_) / name); }

  fs::path base_;
  std::string root_, outside_;
};

TEST_F(ConfinedPathTest, SymlinkInsideRootPointingOutIsRefusedNamingPathAndRoot) {
  fs::create_symlink(outside_ + "/secret", root_ + "/model.safetensors");
  auto p = ConfinedPath(root_ + "/model.safetensors", {root_});
  ASSERT_TRUE(p.status().IsInvalidArgument()) << p.status().ToString();
  EXPECT_THAT(p.status().message(), HasSubstr(root_ + "/model.safetensors: resolves to"));
  EXPECT_THAT(p.status().message(), HasSubstr("outside the allowed roots (" + root_ + ")"));
  SetProcessAllowedRoots({root_});
  auto read = ReadFileToString(root_ + "/model.safetensors");
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), Not(HasSubstr("top secret")));
}

TEST_F(ConfinedPathTest, SymlinkThatStaysInsideTheRootIsFollowed) {
  fs::create_directories(root_ + "/blobs");
  std::ofstream(root_ + "/blobs/abc") << "weights";
  fs::create_symlink("blobs/abc", root_ + "/model.safetensors");  // Hugging Face's cache layout
  SetProcessAllowedRoots({root_});
  auto read = ReadFileToString(root_ + "/model.safetensors");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, "weights");
}

TEST_F(ConfinedPathTest, WritesThroughASymlinkedDirectoryCreateNothingOutside) {
  fs::create_directories(root_ + "/out");
  fs::create_symlink(outside_, root_ + "/out/checkpoints");
  SetProcessAllowedRoots({root_});
  Status mk = CreateDirectoriesConfined(root_ + "/out/checkpoints/step-1.tmp");
  EXPECT_TRUE(mk.IsInvalidArgument()) << mk.ToString();
  Status w = WriteFileDurably(root_ + "/out/checkpoints/state.json", "{}");
  EXPECT_TRUE(w.IsInvalidArgument()) << w.ToString();
  EXPECT_THAT(w.message(), HasSubstr(root_));
  Status mv = RenameDurably(root_ + "/out/x", root_ + "/out/checkpoints/x");
  EXPECT_FALSE(mv.ok());
  EXPECT_FALSE(OutsideHolds("step-1.tmp"));
  EXPECT_FALSE(OutsideHolds("state.json"));
}

TEST_F(ConfinedPathTest, ParentSwappedForSymlinkAfterACheckIsRefusedAtTheNextOpen) {
  fs::create_directories(root_ + "/job/out");
  SetProcessAllowedRoots({root_});
  ASSERT_TRUE(WriteFileDurably(root_ + "/job/out/a.json", "1").ok());  // fine before the swap
  fs::rename(root_ + "/job", outside_ + "/job");
  fs::create_symlink(outside_ + "/job", root_ + "/job");
  Status w = WriteFileDurably(root_ + "/job/out/b.json", "2");
  EXPECT_TRUE(w.IsInvalidArgument()) << w.ToString();
  EXPECT_THAT(w.message(), HasSubstr("outside the allowed roots"));
  EXPECT_FALSE(OutsideHolds("job/out/b.json"));
}

TEST_F(ConfinedPathTest, DotDotAfterTheMissingPartAndEmptyPathsAreRefused) {
  EXPECT_TRUE(ConfinedPath(root_ + "/new/../../outside/x", {root_}).status().IsInvalidArgument());
  EXPECT_TRUE(ConfinedPath("", {root_}).status().IsInvalidArgument());
  auto fresh = ConfinedPath(root_ + "/new/dir/file", {root_});
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  EXPECT_EQ(*fresh, fs::canonical(root_).string() + "/new/dir/file");
}

TEST_F(ConfinedPathTest, WithoutRootsPathsAreLeftAlone) {
  fs::create_symlink(outside_ + "/secret", root_ + "/link");
  auto p = ConfinedPath(root_ + "/link", {});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, root_ + "/link");
  EXPECT_EQ(*ReadFileToString(root_ + "/link"), "top secret");
}

// A read that would block is a failure, not a hang: the test waits a bounded time.
StatusOr<std::string> ReadWithin(const std::string& path, uint64_t cap) {
  auto f = std::async(std::launch::async, [=] { return ReadFileToString(path, cap); });
  if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    std::ofstream unblock(path);  // open the FIFO's write end so the read ends
    ADD_FAILURE() << path << ": the read blocked";
  }
  return f.get();
}

TEST_F(ConfinedPathTest, FifoConfigIsRefusedAtOnceNamingTheFile) {
  const std::string fifo = root_ + "/config.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = ReadWithin(fifo, kMaxConfigFileBytes);
  ASSERT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr(fifo + ": is a FIFO, not a regular file"));
}

TEST_F(ConfinedPathTest, SymlinkToDevZeroIsRefusedInsteadOfReadForever) {
  fs::create_symlink("/dev/zero", root_ + "/config.json");
  auto r = ReadWithin(root_ + "/config.json", kMaxConfigFileBytes);
  ASSERT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("a character device, not a regular file"));
}

TEST_F(ConfinedPathTest, FileOverTheSizeCapIsRefusedNamingTheLimit) {
  const std::string big = root_ + "/index.json";
  std::ofstream(big, std::ios::binary).close();
  fs::resize_file(big, (uint64_t{16} << 20) + 1);
  auto r = ReadFileToString(big, kMaxConfigFileBytes);
  ASSERT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("over the limit of 16 MiB"));
  EXPECT_TRUE(ReadFileToString(root_ + "/missing").status().IsNotFound());
}

}  // namespace
}  // namespace ft
