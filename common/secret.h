// Secrets (bearer tokens, attempt credentials): compared without timing leaks.
// A comparison takes the same time whichever byte differs (OpenSSL's
// CRYPTO_memcmp); inputs of different lengths compare unequal at once, which
// reveals only the length. Secrets are never logged: callers put "missing or
// wrong token" in messages, never the token (tests/e2e checks every log for
// them).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/status.h"

namespace ft {

bool SecretEquals(std::string_view given, std::string_view expected);

// `bytes` bytes from OpenSSL's CSPRNG (RAND_bytes), as lowercase hex (2 × bytes
// characters). Internal when the generator fails (it is not seeded).
StatusOr<std::string> RandomHex(size_t bytes);

// HMAC-SHA256 of `message` under `key`, as 64 lowercase hex characters.
std::string HmacSha256Hex(std::string_view key, std::string_view message);

}  // namespace ft
