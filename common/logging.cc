#include "common/logging.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

#ifdef FT_HAVE_SPDLOG
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#endif

namespace ft::log {
namespace {

std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
std::mutex g_mu;
Options g_options;  // GUARDED_BY(g_mu)

[[maybe_unused]] const char* LevelName(Level level) {
  switch (level) {
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarn: return "warn";
    case Level::kError: return "error";
  }
  return "info";
}

#ifdef FT_HAVE_SPDLOG
std::shared_ptr<spdlog::logger> g_logger;  // GUARDED_BY(g_mu)

spdlog::level::level_enum ToSpd(Level level) {
  switch (level) {
    case Level::kDebug: return spdlog::level::debug;
    case Level::kInfo: return spdlog::level::info;
    case Level::kWarn: return spdlog::level::warn;
    case Level::kError: return spdlog::level::err;
  }
  return spdlog::level::info;
}

// REQUIRES: g_mu held.
void RebuildLogger() {
  g_logger =
      std::make_shared<spdlog::logger>(g_options.name, std::make_shared<spdlog::sinks::stderr_sink_mt>());
  g_logger->set_level(spdlog::level::trace);
  if (g_options.json) {
    // The message is escaped by Write(); %v is placed inside the quotes.
    g_logger->set_pattern(
        "{\"ts\":\"%Y-%m-%dT%H:%M:%S.%e%z\",\"level\":\"%l\",\"logger\":\"%n\",\"msg\":\"%v\"}");
  } else {
    g_logger->set_pattern("%Y-%m-%d %H:%M:%S.%e [%l] %v");
  }
}
#endif

}  // namespace

void Configure(const Options& options) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_options = options;
  g_level.store(static_cast<int>(options.level));
#ifdef FT_HAVE_SPDLOG
  RebuildLogger();
#endif
}

StatusOr<Level> ParseLevel(std::string_view text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "debug") return Level::kDebug;
  if (lower == "info") return Level::kInfo;
  if (lower == "warn" || lower == "warning") return Level::kWarn;
  if (lower == "error") return Level::kError;
  return Status::InvalidArgument("unknown log level '" + std::string(text) +
                                 "' (use debug, info, warn or error)");
}

bool Enabled(Level level) { return static_cast<int>(level) >= g_level.load(); }

std::string JsonEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

void Write(Level level, std::string_view message) {
  if (!Enabled(level)) return;
  std::lock_guard<std::mutex> lock(g_mu);
  std::string text = g_options.json ? JsonEscape(message) : std::string(message);
#ifdef FT_HAVE_SPDLOG
  if (!g_logger) RebuildLogger();
  g_logger->log(ToSpd(level), "{}", text);
#else
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
  if (g_options.json) {
    std::fprintf(stderr, "{\"ts\":\"%s\",\"level\":\"%s\",\"logger\":\"%s\",\"msg\":\"%s\"}\n", ts,
                 LevelName(level), g_options.name.c_str(), text.c_str());
  } else {
    std::fprintf(stderr, "%s [%s] %s\n", ts, LevelName(level), text.c_str());
  }
#endif
}

}  // namespace ft::log
