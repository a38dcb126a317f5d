// A self-signed certificate for the tests' TLS servers and clients, made by
// the system's openssl: <dir>/cert.pem and <dir>/key.pem (an EC P-256 key,
// valid two days), subject CN `common_name` and subjectAltName `alt_names`
// (e.g. "IP:127.0.0.1" or "IP:127.0.0.1,DNS:localhost"). openssl's output goes
// to <dir>/openssl.log. Returns the command it ran when openssl failed, and an
// empty string on success.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace ft::testing_support {

inline std::string MakeSelfSignedCertificate(const std::string& dir, const std::string& common_name,
                                             const std::string& alt_names) {
  std::filesystem::create_directories(dir);
  const std::string command =
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=" +
      common_name + " -addext subjectAltName=" + alt_names + " -keyout " + dir + "/key.pem -out " + dir +
      "/cert.pem >" + dir + "/openssl.log 2>&1";
  return std::system(command.c_str()) == 0 ? std::string() : command;
}

}  // namespace ft::testing_support
