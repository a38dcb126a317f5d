// Secrets (bearer tokens): compared without timing leaks. A comparison takes
// the same time whichever byte differs (OpenSSL's CRYPTO_memcmp); inputs of
// different lengths compare unequal at once, which reveals only the length.
// Secrets are never logged: callers put "missing or wrong token" in messages,
// never the token (tests/e2e checks every log for them).
#pragma once

#include <string_view>

namespace ft {

bool SecretEquals(std::string_view given, std::string_view expected);

}  // namespace ft
