#include "engine/text/tokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/utf8.h"

namespace ft {
namespace {

// Oniguruma's \s is Unicode White_Space; PCRE2's (with UCP) also matches
// U+180E. Rewrites \s and \S outside and inside character classes, leaving
// other escapes (including an escaped backslash) untouched.
std::string RewriteWhitespaceClasses(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != '\\' || i + 1 >= p.size()) {
      out.push_back(p[i]);
      continue;
    }
    const char next = p[++i];
    if (next == 's') {
      out += "\\p{White_Space}";
    } else if (next == 'S') {
      out += "\\P{White_Space}";
    } else {
      out.push_back('\\');
      out.push_back(next);
    }
  }
  return out;
}

// Per-thread match data (one ovector pair is all FindAll reads) and JIT stack.
struct ThreadMatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  ThreadMatchState() {
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& MatchState() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

TokenizerRegex::~TokenizerRegex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

StatusOr<std::unique_ptr<TokenizerRegex>> TokenizerRegex::Compile(std::string_view pattern, bool literal) {
  std::unique_ptr<TokenizerRegex> re(new TokenizerRegex());
  re->pattern_ = literal ? std::string(pattern) : RewriteWhitespaceClasses(pattern);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re->pattern_.data()), re->pattern_.size(),
                                   options, &error, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::InvalidArgument("regex '" + std::string(pattern) +
                                   "' does not compile: " + reinterpret_cast<const char*>(message) +
                                   " at offset " + std::to_string(error_offset));
  }
  re->code_ = code;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return re;
}

void TokenizerRegex::FindAll(std::string_view subject, std::vector<std::pair<size_t, size_t>>* out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadMatchState& st = MatchState();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  while (start <= subject.size()) {
    // The subject was validated once by the caller: skip PCRE2's per-call check.
    int rc = pcre2_match(code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, st.data, st.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // pathological backtracking: retry interpreted
      rc =
          pcre2_match(code, s, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, st.data, st.context);
    }
    if (rc < 0) break;  // no match (or a resource limit): the rest stays unmatched
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out->emplace_back(b, e);
      start = e;
    } else {  // empty match: step over one character
      if (b >= subject.size()) break;
      start = Utf8SkipContinuation(subject, b + 1);
    }
  }
}

}  // namespace ft
