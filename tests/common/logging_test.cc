#include "common/logging.h"

#include <gtest/gtest.h>

namespace ft::log {
namespace {

TEST(LoggingTest, ParsesLevels) {
  EXPECT_EQ(*ParseLevel("DEBUG"), Level::kDebug);
  EXPECT_EQ(*ParseLevel("warning"), Level::kWarn);
  auto bad = ParseLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("use debug, info, warn or error"), std::string::npos);
}

TEST(LoggingTest, LevelFiltersMessages) {
  Configure({.level = Level::kWarn});
  EXPECT_FALSE(Enabled(Level::kInfo));
  EXPECT_TRUE(Enabled(Level::kError));
  testing::internal::CaptureStderr();
  FT_LOG(INFO) << "hidden";
  FT_LOG(ERROR) << "shown " << 42;
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("hidden"), std::string::npos);
  EXPECT_NE(err.find("[error] shown 42"), std::string::npos) << err;
}

TEST(LoggingTest, JsonModeWritesOneEscapedObjectPerLine) {
  Configure({.level = Level::kInfo, .json = true, .name = "ftd"});
  testing::internal::CaptureStderr();
  FT_LOG(INFO) << "say \"hi\"\nthere";
  std::string err = testing::internal::GetCapturedStderr();
  Configure({});
  EXPECT_NE(err.find("\"level\":\"info\""), std::string::npos) << err;
  EXPECT_NE(err.find("\"logger\":\"ftd\""), std::string::npos) << err;
  EXPECT_NE(err.find("\"msg\":\"say \\\"hi\\\"\\nthere\"}"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), err.size() - 1) << "exactly one line: " << err;
}

TEST(LoggingTest, JsonEscapeHandlesControlCharacters) {
  EXPECT_EQ(JsonEscape(std::string("a\x01") + "b\\"), "a\\u0001b\\\\");
}

}  // namespace
}  // namespace ft::log
