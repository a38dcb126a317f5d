#include "engine/text/tokenizer_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/utf8.h"

namespace ft {
namespace {

// The interpreter's backtracking memory per match (KiB); JIT matching has its stack (below).
constexpr uint32_t kHeapLimitKiB = 64 << 10;

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
    if (context) pcre2_set_heap_limit(context, kHeapLimitKiB);
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

// A try that ran out of its work (steps, backtracking depth or the interpreter's memory).
bool OutOfWork(int rc) {
  return rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT;
}

StatusOr<pcre2_code*> CompileCode(const std::string& pattern, uint32_t options, std::string_view original) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                                   &error, &error_offset, nullptr);
  if (code != nullptr) return code;
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(error, message, sizeof(message));
  return Status::InvalidArgument("regex '" + std::string(original) +
                                 "' does not compile: " + reinterpret_cast<const char*>(message) +
                                 " at offset " + std::to_string(error_offset));
}

}  // namespace

TokenizerRegex::~TokenizerRegex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
  pcre2_code_free(static_cast<pcre2_code*>(anchored_));
}

StatusOr<std::unique_ptr<TokenizerRegex>> TokenizerRegex::Compile(std::string_view pattern, bool literal,
                                                                  std::string where) {
  std::unique_ptr<TokenizerRegex> re(new TokenizerRegex());
  re->original_ = std::string(pattern);
  re->pattern_ = literal ? std::string(pattern) : RewriteWhitespaceClasses(pattern);
  re->where_ = std::move(where);
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  FT_ASSIGN_OR_RETURN(pcre2_code * code, CompileCode(re->pattern_, options, pattern));
  re->code_ = code;
  FT_ASSIGN_OR_RETURN(pcre2_code * anchored, CompileCode(re->pattern_, options | PCRE2_ANCHORED, pattern));
  re->anchored_ = anchored;
  re->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  pcre2_jit_compile(anchored, PCRE2_JIT_COMPLETE);  // interpreted when it fails: same results
  return re;
}

int TokenizerRegex::Match(std::string_view subject, size_t start, uint32_t limit, bool anchored) const {
  ThreadMatchState& st = MatchState();
  pcre2_set_match_limit(st.context, limit);
  pcre2_set_depth_limit(st.context, limit);  // the interpreter's backtracking depth (JIT ignores it)
  auto* code = static_cast<pcre2_code*>(anchored ? anchored_ : code_);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  // The subject was validated once by the caller: skip PCRE2's per-call check.
  int rc = pcre2_match(code, s, subject.size(), start, PCRE2_NO_UTF_CHECK, st.data, st.context);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // deep backtracking for JIT's stack: the interpreter's heap
    rc = pcre2_match(code, s, subject.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, st.data, st.context);
  }
  return rc;
}

Status TokenizerRegex::FindAll(std::string_view subject, std::vector<std::pair<size_t, size_t>>* out) const {
  uint64_t extra = kExtraWorkBase + kExtraWorkPerByte * subject.size();
  size_t start = 0;
  while (start <= subject.size()) {
    int rc = Match(subject, start, kFirstMatchLimit, /*anchored=*/false);
    if (OutOfWork(rc)) {
      size_t resume = start;
      FT_ASSIGN_OR_RETURN(rc, MatchWithMoreWork(subject, start, &extra, &resume));
      if (rc == PCRE2_ERROR_NOMATCH && resume <= subject.size()) {
        start = resume;
        continue;
      }
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return Exceeded(subject, start, rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(MatchState().data);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out->emplace_back(b, e);
      start = e;
    } else {  // empty match: step over one character
      if (b >= subject.size()) break;
      start = Utf8SkipContinuation(subject, b + 1);
    }
  }
  return Status::OK();
}

StatusOr<int> TokenizerRegex::MatchWithMoreWork(std::string_view subject, size_t start, uint64_t* extra,
                                                size_t* resume) const {
  // The positions before the one that ran out failed within kFirstMatchLimit: one at a time
  // they cost what they cost in the search; the first that runs out gets more.
  for (size_t p = start; p <= subject.size(); p = Utf8SkipContinuation(subject, p + 1)) {
    int rc = Match(subject, p, kFirstMatchLimit, /*anchored=*/true);
    if (rc == PCRE2_ERROR_NOMATCH) {
      if (p == subject.size()) break;
      continue;
    }
    for (uint64_t limit = uint64_t{2} * kFirstMatchLimit; OutOfWork(rc); limit *= 2) {
      if (limit > *extra || limit > UINT32_MAX) return Exceeded(subject, p, rc);
      *extra -= limit;
      rc = Match(subject, p, static_cast<uint32_t>(limit), /*anchored=*/true);
    }
    if (rc == PCRE2_ERROR_NOMATCH)
      *resume = p < subject.size() ? Utf8SkipContinuation(subject, p + 1) : p + 1;
    return rc;
  }
  *resume = subject.size() + 1;
  return PCRE2_ERROR_NOMATCH;
}

Status TokenizerRegex::Exceeded(std::string_view subject, size_t at, int rc) const {
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(rc, message, sizeof(message));
  const std::string shown = original_.size() <= 300 ? original_ : original_.substr(0, 300) + "...";
  if (!OutOfWork(rc)) {
    return Status::InvalidArgument(where_ + ": regex '" + shown + "' failed at byte " + std::to_string(at) +
                                   " of an input of " + std::to_string(subject.size()) +
                                   " bytes: " + reinterpret_cast<const char*>(message));
  }
  return Status::InvalidArgument(
      where_ + ": regex '" + shown + "' needs more work than allowed at byte " + std::to_string(at) +
      " of an input of " + std::to_string(subject.size()) + " bytes (" +
      reinterpret_cast<const char*>(message) +
      "): the pattern backtracks catastrophically on this text, where tokens could differ from Hugging "
      "Face's; simplify the pattern (no nested repeats such as (a+)+) or remove the text");
}

}  // namespace ft
