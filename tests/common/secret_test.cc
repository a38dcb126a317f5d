// common/secret.h: equal secrets compare equal, any difference (a byte, the
// length, empty) does not; random secrets are hex of the asked length and
// differ; HMAC-SHA256 matches RFC 4231.
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

TEST(SecretTest, RandomHexHasTheAskedLengthAndNeverRepeats) {
  auto a = RandomHex(16), b = RandomHex(16);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 32u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos) << *a;
  EXPECT_NE(*a, *b);
}

TEST(SecretTest, HmacSha256MatchesRfc4231) {
  // RFC 4231, test case 2.
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

}  // namespace
}  // namespace ft
