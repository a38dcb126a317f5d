// TLS for ftd's HTTP server: the OpenSSL context (Boost.Asio ssl) built from
// the same PEM certificate chain and private key that ftd's gRPC side serves
// with (--tls-cert/--tls-key).
//
// Success: a server context that offers TLS 1.2 and newer only, with the chain
// and key loaded and checked to belong together. Failure: InvalidArgument
// naming the flag and the file when one of them is missing, unreadable, not
// PEM, or when the key does not match the certificate. Nothing here logs.
//
// Thread safety: the returned context is shared by every connection and is
// not changed after this returns.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <memory>
#include <string>

#include "common/status.h"

namespace ft {

struct HttpTlsFiles {
  std::string cert_file;  // PEM certificate chain, leaf first ("" together with key_file = plaintext)
  std::string key_file;   // PEM private key of the leaf
};

StatusOr<std::shared_ptr<boost::asio::ssl::context>> MakeHttpTlsContext(const HttpTlsFiles& files);

}  // namespace ft
