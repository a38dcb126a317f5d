// Users from a file ftd reads at start and again on SIGHUP (ftd --tokens-file): for sites that
// keep their users in configuration management rather than in ftd's database. One user a line,
//
//   token,user,team,role      e.g.  9f2c...e1,alice,nlp,member
//
// (Kubernetes' static token file, with a team and a role: admin | member | viewer; an admin's
// team may be empty). Blank lines and lines starting with '#' are skipped. A token is 16 to 256
// characters of [A-Za-z0-9._~+/=-]; names follow CheckIdentityName. No token and no user may
// appear twice. The file holds secrets, so ftd refuses one that its group or others may read
// (chmod 600).
//
// These users resolve like the database's (daemon/authorization.h), are never stored, and are
// replaced as a whole by each successful load: a token removed from the file stops working at the
// reload. A load that fails (the file gone, a bad line) changes nothing and says why, naming the
// file, the line and the field.
//
// Thread safety: Load and Resolve may be called from any thread.
#pragma once

#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/status.h"
#include "daemon/authorization.h"

namespace ft {

class TokensFile {
 public:
  // Reads `path` and, when every line is valid, replaces the users with its users. Returns how
  // many it now holds; InvalidArgument (file:line: field: what and how to fix it) or the read's
  // error otherwise, keeping the previous users.
  StatusOr<size_t> Load(const std::string& path);
  // The user holding `token`, or nullopt.
  std::optional<Identity> Resolve(std::string_view token) const;
  bool empty() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, Identity> by_digest_;  // GUARDED_BY(mu_) keyed by Digest(token)
};

}  // namespace ft
