// Daemon: users in teams (daemon/authorization.h). Each change is a user_* event naming who made it.
#include "daemon/authorization.h"
#include "daemon/daemon.h"

namespace ft {

void Daemon::UserEvent(const std::string& kind, const std::string& message) {
  Held lock(this);
  Event("", "", kind, message, 0);
  ReleaseAndPublish(lock);
}

StatusOr<std::string> Daemon::AddUser(const Actor& by, const std::string& name, const std::string& team,
                                      const std::string& role) {
  FT_RETURN_IF_ERROR(CheckIdentityName(name, "user name"));
  FT_RETURN_IF_ERROR(CheckIdentityName(team, "team"));
  FT_RETURN_IF_ERROR(ParseRole(role).status());
  if (name == "admin" || name == "local" || name == "view-token") {
    return Status::InvalidArgument("user name '" + name +
                                   "' is reserved (ftd's own identities); choose another");
  }
  FT_ASSIGN_OR_RETURN(IssuedToken t, IssueToken());
  UserRow row{.name = name,
              .team = team,
              .role = role,
              .token_id = t.token_id,
              .token_salt = t.salt,
              .token_hash = t.hash,
              .created_ms = clock_->WallMs()};
  FT_RETURN_IF_ERROR(store_->AddUser(row));
  UserEvent("user_added", "user " + name + " (" + role + " of team " + team + ") added" + by.By());
  return t.token;
}

Status Daemon::RemoveUser(const Actor& by, const std::string& name) {
  FT_RETURN_IF_ERROR(store_->RemoveUser(name));
  UserEvent("user_removed", "user " + name + " removed" + by.By() + "; its token no longer works");
  return Status::OK();
}

StatusOr<std::string> Daemon::RotateUserToken(const Actor& by, const std::string& name) {
  FT_ASSIGN_OR_RETURN(IssuedToken t, IssueToken());
  FT_RETURN_IF_ERROR(store_->SetUserToken(name, t.token_id, t.salt, t.hash));
  UserEvent("user_token", "user " + name + " has a new token" + by.By() + "; the old one no longer works");
  return t.token;
}

StatusOr<std::vector<UserInfo>> Daemon::ListUsers() {
  FT_ASSIGN_OR_RETURN(std::vector<UserRow> rows, store_->ListUsers());
  std::vector<UserInfo> out;
  for (const UserRow& u : rows) out.push_back({u.name, u.team, u.role, u.created_ms});
  return out;
}

}  // namespace ft
