// Transport security for ftd's gRPC endpoints, shared by ftd, ft-worker and
// ftctl: TLS when configured, plaintext otherwise (loopback and trusted
// networks; bearer tokens still apply).
//
// Server: a PEM certificate chain and its private key turn TLS on. Client:
// a PEM CA bundle turns TLS on and is the only root trusted; "system" uses the
// system's roots. Failure: InvalidArgument naming the flag and the file when
// a file is missing, unreadable or not PEM, or when only one of cert/key is
// given. Nothing here logs.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/status.h"

namespace ft {

struct ServerTls {
  std::string cert_file;  // --tls-cert: PEM certificate chain ("" = plaintext)
  std::string key_file;   // --tls-key: PEM private key
};

// Plaintext credentials when both files are empty.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTls& tls);

// `ca_file`: "" = plaintext, "system" = TLS with the system's roots, else a
// PEM CA bundle (--tls-ca, env FTUNE_TLS_CA).
StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const std::string& ca_file);

}  // namespace ft
