// Regular expressions for tokenizer.json patterns (Split pre-tokenizer,
// Replace normalizer/decoder), on PCRE2 with UTF + UCP and JIT.
//
// tokenizer.json patterns are written for Oniguruma (what Hugging Face's Rust
// tokenizers uses). The one construct whose meaning differs under PCRE2 is
// \s / \S: Oniguruma means Unicode White_Space, PCRE2's UCP \s adds U+180E; so
// \s and \S are rewritten to \p{White_Space} / \P{White_Space}.
//
// Work is bounded per input, so a pattern that backtracks catastrophically
// (nested repeats such as (a+)+) fails fast with a named error instead of
// running for minutes or, at PCRE2's own limit, silently leaving text
// unmatched (other tokens than Hugging Face's). PCRE2 counts its work per
// start position (match limit: steps of its matching loop; depth and heap
// limits for the interpreter). Each position first gets kFirstMatchLimit
// steps, which real pre-tokenizer patterns need only for a match some
// thousand characters long (they need about one step per character
// matched). A position that needs more is retried alone with doubled limits,
// each try charged in full to the input's extra budget, kExtraWorkBase +
// kExtraWorkPerByte per byte of input. So an input of n bytes costs at most
// about 2·(n+1)·kFirstMatchLimit + the extra budget steps (some milliseconds
// per kilobyte), whatever the pattern.
//
// Thread safety: a compiled Regex is immutable; FindAll may run concurrently
// (match data and JIT stacks are per thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ft {

inline constexpr uint32_t kFirstMatchLimit = 1000;
inline constexpr uint64_t kExtraWorkBase = uint64_t{1} << 16;
inline constexpr uint64_t kExtraWorkPerByte = 8;

class TokenizerRegex {
 public:
  ~TokenizerRegex();
  TokenizerRegex(const TokenizerRegex&) = delete;
  TokenizerRegex& operator=(const TokenizerRegex&) = delete;

  // `literal`: match `pattern` as a plain string. Errors carry PCRE2's message
  // and the offset in the pattern. `where` names the pattern in FindAll's
  // errors, e.g. "/m/tokenizer.json: pre_tokenizer.pretokenizers[0].pattern".
  static StatusOr<std::unique_ptr<TokenizerRegex>> Compile(std::string_view pattern, bool literal,
                                                           std::string where = "regex");

  // Appends [begin, end) of every non-overlapping match in `subject` (which
  // must be valid UTF-8), left to right. An empty match advances one
  // character. InvalidArgument naming `where`, the pattern, the input's
  // length, the byte where the work ran out and the fix when the input needs
  // more work than the bound above (*out then holds the matches before it).
  Status FindAll(std::string_view subject, std::vector<std::pair<size_t, size_t>>* out) const;

  // The pattern after the Oniguruma -> PCRE2 rewrite (for tests and messages).
  const std::string& pcre2_pattern() const { return pattern_; }
  // Whether PCRE2's JIT compiled it (else matching is interpreted, slower).
  bool jit() const { return jit_; }

 private:
  TokenizerRegex() = default;
  // pcre2_match from `start` with `limit` steps per position (anchored: at `start` only);
  // PCRE2's return code (the match is in the thread's match data).
  int Match(std::string_view subject, size_t start, uint32_t limit, bool anchored) const;
  // After the search from `start` ran out of kFirstMatchLimit at some position: finds that
  // position, retries it alone with doubled limits charged to *extra, and returns the match
  // (rc >= 0, *resume unchanged) or PCRE2_ERROR_NOMATCH with *resume where the search goes on.
  StatusOr<int> MatchWithMoreWork(std::string_view subject, size_t start, uint64_t* extra,
                                  size_t* resume) const;
  Status Exceeded(std::string_view subject, size_t at, int rc) const;

  std::string original_;  // as tokenizer.json gives it
  std::string pattern_;
  std::string where_;
  void* code_ = nullptr;      // pcre2_code_8*
  void* anchored_ = nullptr;  // the same pattern compiled anchored (for one position at a time)
  bool jit_ = false;
};

}  // namespace ft
