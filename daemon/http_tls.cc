#include "daemon/http_tls.h"

#include <boost/system/error_code.hpp>

namespace ft {

namespace ssl = boost::asio::ssl;

StatusOr<std::shared_ptr<ssl::context>> MakeHttpTlsContext(const HttpTlsFiles& files) {
  if (files.cert_file.empty() || files.key_file.empty()) {
    return Status::InvalidArgument(std::string("HTTPS needs both --tls-cert and --tls-key; ") +
                                   (files.cert_file.empty() ? "--tls-cert" : "--tls-key") + " is missing");
  }
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                   ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  boost::system::error_code ec;
  ctx->use_certificate_chain_file(files.cert_file, ec);
  if (ec) {
    return Status::InvalidArgument("--tls-cert '" + files.cert_file +
                                   "': cannot load a PEM certificate chain from it (" + ec.message() + ")");
  }
  // OpenSSL also checks here that the key belongs to the certificate loaded above.
  ctx->use_private_key_file(files.key_file, ssl::context::pem, ec);
  if (ec) {
    return Status::InvalidArgument("--tls-key '" + files.key_file +
                                   "': cannot load it as the PEM private key of --tls-cert (" + ec.message() +
                                   ")");
  }
  return ctx;
}

}  // namespace ft
