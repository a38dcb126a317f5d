// Logging for every ftune binary: stream-style macros over spdlog.
//
//   FT_LOG(INFO) << "checkpoint step " << step << " written in " << ms << " ms";
//
// Levels: DEBUG, INFO, WARN, ERROR. Output goes to stderr, either as text
// ("2026-11-21 09:10:11.123 [info] message") or as one JSON object per line
// ({"ts":...,"level":"info","msg":"..."}) for log collectors. Builds without
// spdlog (engine-only machines) fall back to the same formats on stderr.
//
// Thread safety: logging may be called from any thread; Configure() should be
// called once at start-up, before other threads log.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ft::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

struct Options {
  Level level = Level::kInfo;
  bool json = false;        // one JSON object per line instead of text
  std::string name = "ft";  // logger name, shown in JSON as "logger"
};

// Sets level and format. Safe to call again (e.g. after parsing flags).
void Configure(const Options& options);

// Parses "debug" | "info" | "warn" | "error" (case-insensitive).
StatusOr<Level> ParseLevel(std::string_view text);

// True when messages at `level` are emitted.
bool Enabled(Level level);

// Emits one message (used by the macro; callable directly).
void Write(Level level, std::string_view message);

// Escapes a string for inclusion inside a JSON string literal.
std::string JsonEscape(std::string_view text);

// Collects one message and writes it when destroyed.
class Message {
 public:
  explicit Message(Level level) : level_(level) {}
  ~Message() { Write(level_, stream_.str()); }
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  Level level_;
  std::ostringstream stream_;
};

// Turns the stream expression into void so both ?: branches agree.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace ft::log

#define FT_LOG_LEVEL_DEBUG ::ft::log::Level::kDebug
#define FT_LOG_LEVEL_INFO ::ft::log::Level::kInfo
#define FT_LOG_LEVEL_WARN ::ft::log::Level::kWarn
#define FT_LOG_LEVEL_ERROR ::ft::log::Level::kError
// A single expression (safe inside an unbraced if/else); the stream operands
// are evaluated only when the level is enabled.
#define FT_LOG(severity)                       \
  !::ft::log::Enabled(FT_LOG_LEVEL_##severity) \
      ? (void)0                                \
      : ::ft::log::Voidify() & ::ft::log::Message(FT_LOG_LEVEL_##severity).stream()
