#include "proto/credentials.h"

#include "common/file_util.h"

namespace ft {

namespace {

// The PEM text of `path`, or InvalidArgument naming `flag` and the file.
StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return Status::InvalidArgument(flag + " '" + path + "': cannot read it (" + text.status().message() +
                                   "); give a readable PEM file");
  }
  if (text->find("-----BEGIN ") == std::string::npos) {
    return Status::InvalidArgument(flag + " '" + path + "': not a PEM file (no '-----BEGIN' line)");
  }
  return text;
}

}  // namespace

StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTls& tls) {
  if (tls.cert_file.empty() && tls.key_file.empty()) return grpc::InsecureServerCredentials();
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return Status::InvalidArgument(std::string("TLS needs both --tls-cert and --tls-key; ") +
                                   (tls.cert_file.empty() ? "--tls-cert" : "--tls-key") + " is missing");
  }
  FT_ASSIGN_OR_RETURN(std::string cert, ReadPem("--tls-cert", tls.cert_file));
  FT_ASSIGN_OR_RETURN(std::string key, ReadPem("--tls-key", tls.key_file));
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({key, cert});
  return grpc::SslServerCredentials(options);
}

StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const std::string& ca_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  if (ca_file != "system") {
    FT_ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem("--tls-ca", ca_file));
  }
  return grpc::SslCredentials(options);
}

}  // namespace ft
