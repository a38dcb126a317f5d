#include "common/utf8.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ft {
namespace {

constexpr Utf8Policy kAllPolicies[] = {Utf8Policy::kAssumeValid, Utf8Policy::kReplace,
                                       Utf8Policy::kEscapeByte};
constexpr Utf8Policy kCheckingPolicies[] = {Utf8Policy::kReplace, Utf8Policy::kEscapeByte};

struct Decoded {
  uint32_t cp;
  uint32_t len;
  bool valid;
  bool operator==(const Decoded&) const = default;
};

Decoded At(std::string_view s, size_t pos, Utf8Policy policy) {
  const Utf8Char c = DecodeUtf8(s, pos, policy);
  return {c.cp, c.len, c.valid};
}

// Every (code point, length) of `s` decoded from the start under `policy`.
std::vector<Decoded> All(std::string_view s, Utf8Policy policy) {
  std::vector<Decoded> out;
  for (size_t i = 0; i < s.size(); i += out.back().len) out.push_back(At(s, i, policy));
  return out;
}

TEST(Utf8Test, EveryPolicyDecodesWellFormedOneToFourByteSequences) {
  const std::vector<std::pair<std::string, uint32_t>> cases = {{"A", 'A'},
                                                               {std::string(1, '\0'), 0},
                                                               {"\x7F", 0x7F},
                                                               {"\xC2\x80", 0x80},
                                                               {"\xC3\xA9", 0xE9},
                                                               {"\xDF\xBF", 0x7FF},
                                                               {"\xE0\xA0\x80", 0x800},
                                                               {"\xE2\x82\xAC", 0x20AC},
                                                               {"\xED\x9F\xBF", 0xD7FF},
                                                               {"\xEE\x80\x80", 0xE000},
                                                               {"\xEF\xBF\xBF", 0xFFFF},
                                                               {"\xF0\x90\x80\x80", 0x10000},
                                                               {"\xF0\x9F\x98\x80", 0x1F600},
                                                               {"\xF4\x8F\xBF\xBF", 0x10FFFF}};
  for (Utf8Policy policy : kAllPolicies) {
    for (const auto& [bytes, cp] : cases) {
      EXPECT_EQ(At(bytes, 0, policy), (Decoded{cp, static_cast<uint32_t>(bytes.size()), true}))
          << "policy " << static_cast<int>(policy) << " U+" << std::hex << cp;
    }
  }
}

TEST(Utf8Test, EveryPolicyRoundTripsEveryScalarValueThroughAppendUtf8) {
  std::string bytes;
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    bytes.clear();
    AppendUtf8(cp, &bytes);
    for (Utf8Policy policy : kAllPolicies) {
      const Decoded d = At(bytes, 0, policy);
      ASSERT_EQ(d, (Decoded{cp, static_cast<uint32_t>(bytes.size()), true})) << std::hex << cp;
    }
  }
}

// Each ill-formed case: its bytes, then the maximal ill-formed subpart's length
// (what kReplace consumes).
struct IllFormed {
  const char* what;
  std::string bytes;
  uint32_t subpart;
};

const std::vector<IllFormed>& IllFormedCases() {
  static const std::vector<IllFormed> cases = {
      {"overlong 2-byte NUL", "\xC0\x80", 1},
      {"overlong 2-byte C1", "\xC1\xBF", 1},
      {"overlong 3-byte", "\xE0\x80\x80", 1},
      {"overlong 3-byte top", "\xE0\x9F\xBF", 1},
      {"overlong 4-byte", "\xF0\x80\x80\x80", 1},
      {"overlong 4-byte top", "\xF0\x8F\xBF\xBF", 1},
      {"high surrogate", "\xED\xA0\x80", 1},
      {"low surrogate", "\xED\xBF\xBF", 1},
      {"above U+10FFFF", "\xF4\x90\x80\x80", 1},
      {"lead F5", "\xF5\x80\x80\x80", 1},
      {"lead FF", "\xFF", 1},
      {"stray continuation 80", "\x80", 1},
      {"stray continuation BF", "\xBF", 1},
      {"truncated 2-byte", "\xC3", 1},
      {"truncated 3-byte", "\xE2\x82", 2},
      {"truncated 4-byte", "\xF0\x9F\x98", 3},
      {"3-byte cut by ASCII",
       "\xE2\x82"
       "A",
       2},
      {"4-byte cut by a lead", "\xF0\x9F\xC3\xA9", 2},
  };
  return cases;
}

TEST(Utf8Test, ReplaceGivesOneReplacementPerMaximalIllFormedSubpart) {
  for (const IllFormed& c : IllFormedCases()) {
    EXPECT_EQ(At(c.bytes, 0, Utf8Policy::kReplace), (Decoded{0xFFFD, c.subpart, false})) << c.what;
  }
}

TEST(Utf8Test, EscapeByteGivesTheFirstByteAsALoneSurrogate) {
  for (const IllFormed& c : IllFormedCases()) {
    const auto b0 = static_cast<uint8_t>(c.bytes[0]);
    EXPECT_EQ(At(c.bytes, 0, Utf8Policy::kEscapeByte), (Decoded{0xDC00u + b0, 1, false})) << c.what;
  }
}

TEST(Utf8Test, AssumeValidNeverStepsPastTheEndOfIllFormedInput) {
  for (const IllFormed& c : IllFormedCases()) {
    for (size_t i = 0; i < c.bytes.size(); ++i) {
      const Decoded d = At(c.bytes, i, Utf8Policy::kAssumeValid);
      EXPECT_GE(d.len, 1u) << c.what;
      EXPECT_LE(i + d.len, c.bytes.size()) << c.what << " at " << i;
    }
  }
  // A complete but ill-formed sequence is decoded as its lead byte says (the
  // tokenizer's NextCodePoint has always done so).
  EXPECT_EQ(At("\xC0\x80", 0, Utf8Policy::kAssumeValid), (Decoded{0, 2, true}));
  EXPECT_EQ(At("\x80", 0, Utf8Policy::kAssumeValid), (Decoded{0x80, 1, true}));
}

// Unicode 15, section 3.9, table 3-8: U+FFFD for each maximal subpart.
TEST(Utf8Test, ReplaceFollowsTheUnicodeStandardsExample) {
  const std::string bytes = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  std::vector<uint32_t> cps;
  for (const Decoded& d : All(bytes, Utf8Policy::kReplace)) cps.push_back(d.cp);
  EXPECT_EQ(cps, (std::vector<uint32_t>{'a', 0xFFFD, 0xFFFD, 0xFFFD, 'b', 0xFFFD, 'c', 0xFFFD, 0xFFFD, 'd'}));
  // kEscapeByte: one unit per byte (every non-ASCII byte here is ill-formed).
  EXPECT_EQ(All(bytes, Utf8Policy::kEscapeByte).size(), bytes.size());
}

TEST(Utf8Test, CheckingPoliciesAgreeOnWellFormednessOfEveryShortSequence) {
  // Every 1..3 byte string over the bytes that matter: both checking policies
  // call the same sequences well-formed, and then decode them alike.
  const std::vector<uint8_t> bytes = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1,
                                      0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xF8, 0xFF};
  std::string s(3, '\0');
  for (uint8_t a : bytes) {
    for (uint8_t b : bytes) {
      for (uint8_t c : bytes) {
        s[0] = static_cast<char>(a), s[1] = static_cast<char>(b), s[2] = static_cast<char>(c);
        const Decoded r = At(s, 0, kCheckingPolicies[0]), e = At(s, 0, kCheckingPolicies[1]);
        ASSERT_EQ(r.valid, e.valid) << std::hex << +a << " " << +b << " " << +c;
        if (r.valid) {
          EXPECT_EQ(r, e);
        }
      }
    }
  }
}

TEST(Utf8Test, CharStartStepsBackOverContinuationBytesButNotBelowTheFloor) {
  const std::string s =
      "a\xE2\x82\xAC"
      "b";  // a, U+20AC, b
  EXPECT_EQ(Utf8CharStart(s, 0), 0u);
  EXPECT_EQ(Utf8CharStart(s, 1), 1u);
  EXPECT_EQ(Utf8CharStart(s, 3), 1u);
  EXPECT_EQ(Utf8CharStart(s, 4), 4u);
  EXPECT_EQ(Utf8CharStart(s, 3, 2), 2u);
  EXPECT_EQ(Utf8CharStart("\x80\x80", 1), 0u);  // stray bytes: stops at the floor
}

TEST(Utf8Test, SkipContinuationStepsForwardToTheNextCodePoint) {
  const std::string s =
      "a\xE2\x82\xAC"
      "b";
  EXPECT_EQ(Utf8SkipContinuation(s, 0), 0u);
  EXPECT_EQ(Utf8SkipContinuation(s, 2), 4u);
  EXPECT_EQ(Utf8SkipContinuation(s, 5), 5u);
  EXPECT_EQ(Utf8SkipContinuation("a\x80\x80", 1), 3u);  // to the end
}

}  // namespace
}  // namespace ft
