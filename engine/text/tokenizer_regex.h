// Regular expressions for tokenizer.json patterns (Split pre-tokenizer,
// Replace normalizer/decoder), on PCRE2 with UTF + UCP and JIT.
//
// tokenizer.json patterns are written for Oniguruma (what Hugging Face's Rust
// tokenizers uses). The one construct whose meaning differs under PCRE2 is
// \s / \S: Oniguruma means Unicode White_Space, PCRE2's UCP \s adds U+180E; so
// \s and \S are rewritten to \p{White_Space} / \P{White_Space}.
//
// Thread safety: a compiled Regex is immutable; FindAll may run concurrently
// (match data and JIT stacks are per thread).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ft {

class TokenizerRegex {
 public:
  ~TokenizerRegex();
  TokenizerRegex(const TokenizerRegex&) = delete;
  TokenizerRegex& operator=(const TokenizerRegex&) = delete;

  // `literal`: match `pattern` as a plain string. Errors carry PCRE2's message
  // and the offset in the pattern.
  static StatusOr<std::unique_ptr<TokenizerRegex>> Compile(std::string_view pattern, bool literal);

  // Appends [begin, end) of every non-overlapping match in `subject` (which
  // must be valid UTF-8), left to right. An empty match advances one character.
  void FindAll(std::string_view subject, std::vector<std::pair<size_t, size_t>>* out) const;

  // The pattern after the Oniguruma -> PCRE2 rewrite (for tests and messages).
  const std::string& pcre2_pattern() const { return pattern_; }
  // Whether PCRE2's JIT compiled it (else matching is interpreted, slower).
  bool jit() const { return jit_; }

 private:
  TokenizerRegex() = default;

  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace ft
