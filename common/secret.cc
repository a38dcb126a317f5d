#include "common/secret.h"

#include <openssl/crypto.h>

namespace ft {

bool SecretEquals(std::string_view given, std::string_view expected) {
  return given.size() == expected.size() && CRYPTO_memcmp(given.data(), expected.data(), given.size()) == 0;
}

}  // namespace ft
