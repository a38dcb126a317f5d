// common/secret.h: equal secrets compare equal, any difference (a byte, the
// length, empty) does not.
#include "common/secret.h"

#include <gtest/gtest.h>

#include <string>

namespace ft {
namespace {

TEST(SecretTest, OnlyTheSameBytesCompareEqual) {
  EXPECT_TRUE(SecretEquals("Bearer s3cret", "Bearer s3cret"));
  EXPECT_TRUE(SecretEquals("", ""));
  EXPECT_FALSE(SecretEquals("Bearer s3cret", "Bearer s3creT"));
  EXPECT_FALSE(SecretEquals("Xearer s3cret", "Bearer s3cret"));
  EXPECT_FALSE(SecretEquals("Bearer s3cre", "Bearer s3cret"));
  EXPECT_FALSE(SecretEquals("", "x"));
  const std::string with_nul("a\0b", 3);
  EXPECT_FALSE(SecretEquals(with_nul, std::string("a\0c", 3)));
  EXPECT_TRUE(SecretEquals(with_nul, std::string("a\0b", 3)));
}

}  // namespace
}  // namespace ft
