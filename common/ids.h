// Job ids: the one rule every entry point (gRPC, HTTP, the daemon's log
// paths) checks a caller's job id against before it is used as a key or joined
// into a path. Worker pool names: the rule ft-worker --pool and ftd's
// registration check (they become Prometheus label values and dashboard text).
//
// A job id is "j-" followed by 1 to 18 decimal digits (the store writes
// j-%06d, e.g. "j-000042"). Anything else — "", "../x", "/etc/passwd", a NUL,
// "j-1/../..", non-ASCII, an overlong string — is malformed.
//
// Thread safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace ft {

// The longest job id accepted ("j-" + 18 digits).
inline constexpr size_t kMaxJobIdLength = 20;

// Whether `id` is a well-formed job id.
bool IsValidJobId(std::string_view id);

// OK when `id` is well formed; else InvalidArgument naming `field` (e.g.
// "job_id"), the id (escaped and shortened: it may hold anything) and what ids
// look like.
Status CheckJobId(std::string_view id, std::string_view field);

// A worker pool's name: 1 to 64 of letters, digits, '.', '_' and '-' (e.g.
// "a100-spot", "us-east-1a.p5"). A worker that names none is in this one.
inline constexpr std::string_view kDefaultPool = "default";
inline constexpr size_t kMaxPoolNameLength = 64;
// OK when `pool` is well formed; else InvalidArgument naming `field`, the name
// (escaped, shortened) and the rule.
Status CheckPoolName(std::string_view pool, std::string_view field);

}  // namespace ft
