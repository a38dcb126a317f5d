#include "daemon/authorization.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>

#include "common/logging.h"
#include "common/secret.h"
#include "daemon/tokens_file.h"

namespace ft {

namespace {

// What each action needs: the least role, and whether it is limited to the job's own team.
struct ActionRule {
  Action action;
  const char* name;
  Role least;
  bool own_team_only;
  const char* why;  // said when the role is not enough
};

constexpr std::array<ActionRule, 9> kRules = {{
    {Action::kSubmit, "submit", Role::kMember, false, "viewers may only read"},
    {Action::kReadJob, "read", Role::kViewer, true, ""},
    {Action::kCancel, "cancel", Role::kMember, true, "viewers may only read"},
    {Action::kListJobs, "list", Role::kViewer, false, ""},
    {Action::kReadWorkers, "read the workers of", Role::kViewer, false, ""},
    {Action::kManageUsers, "manage the users of", Role::kAdmin, false, "only admins manage users"},
    {Action::kReadTeams, "read the teams of", Role::kViewer, false, ""},
    {Action::kManageTeams, "set the quotas and weights of the teams of", Role::kAdmin, false,
     "only admins set quotas and weights"},
    {Action::kManageWebhooks, "manage the webhooks of", Role::kAdmin, false, "only admins manage webhooks"},
}};

const ActionRule& RuleOf(Action action) {
  for (const ActionRule& r : kRules)
    if (r.action == action) return r;
  FT_LOG(ERROR) << "authorization: no rule for action " << static_cast<int>(action);
  std::abort();  // a broken invariant: every Action has a row
}

std::string Who(const Identity& who) {
  return "user '" + who.user + "' (" + RoleName(who.role) +
         (who.every_team ? " of every team" : " of team '" + who.team + "'") + ")";
}

constexpr std::string_view kUserTokenPrefix = "ftu_";
constexpr size_t kTokenIdHex = 8;       // bytes → 16 hex characters
constexpr size_t kTokenSecretHex = 24;  // bytes → 48 hex characters

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kAdmin: return "admin";
    case Role::kMember: return "member";
    case Role::kViewer: return "viewer";
  }
  return "viewer";
}

StatusOr<Role> ParseRole(const std::string& name) {
  for (Role r : {Role::kAdmin, Role::kMember, Role::kViewer})
    if (name == RoleName(r)) return r;
  return Status::InvalidArgument("role '" + name + "': use admin, member or viewer");
}

const char* ActionName(Action action) { return RuleOf(action).name; }

Decision Authorize(const Identity& who, Action action, std::string_view job_team, std::string_view job_id) {
  const ActionRule& rule = RuleOf(action);
  const std::string target = job_id.empty() ? std::string(" this ftd") : " job " + std::string(job_id);
  if (who.role < rule.least) {
    return {false, Who(who) + " may not " + rule.name + target + ": " + rule.why};
  }
  if (rule.own_team_only && !who.every_team && job_team != who.team) {
    return {false, Who(who) + " may not " + rule.name + target + ": it belongs to " +
                       (job_team.empty() ? std::string("no team") : "team '" + std::string(job_team) + "'") +
                       ", and a " + RoleName(who.role) + " may only " + rule.name + " its own team's jobs"};
  }
  return {};
}

Status CheckIdentityName(const std::string& name, const std::string& what) {
  const bool ok = !name.empty() && name.size() <= 64 && std::isalnum(static_cast<unsigned char>(name[0])) &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
                  });
  if (ok) return Status::OK();
  return Status::InvalidArgument(what + " '" + name +
                                 "': use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or "
                                 "digit");
}

StatusOr<IssuedToken> IssueToken() {
  IssuedToken t;
  FT_ASSIGN_OR_RETURN(t.token_id, RandomHex(kTokenIdHex));
  FT_ASSIGN_OR_RETURN(std::string secret, RandomHex(kTokenSecretHex));
  FT_ASSIGN_OR_RETURN(t.salt, RandomHex(16));
  t.token = std::string(kUserTokenPrefix) + t.token_id + "_" + secret;
  t.hash = HmacSha256Hex(t.salt, t.token);
  return t;
}

Authenticator::Authenticator(Store* store, std::string client_token, std::string view_token,
                             const TokensFile* file)
    : store_(store),
      file_(file),
      client_token_(std::move(client_token)),
      view_token_(std::move(view_token)) {}

bool Authenticator::open() const {
  if (!client_token_.empty() || (file_ != nullptr && !file_->empty())) return false;
  auto users = store_->HasUsers();
  return users.ok() && !*users;  // a store that cannot answer guards: refuse rather than open
}

std::optional<Identity> Authenticator::UserOf(std::string_view token) const {
  if (token.substr(0, kUserTokenPrefix.size()) != kUserTokenPrefix) return std::nullopt;
  const std::string_view rest = token.substr(kUserTokenPrefix.size());
  const size_t underscore = rest.find('_');
  if (underscore == std::string_view::npos) return std::nullopt;
  auto user = store_->UserByTokenId(std::string(rest.substr(0, underscore)));
  if (!user.ok() || !user->has_value()) return std::nullopt;
  const UserRow& u = **user;
  if (!SecretEquals(HmacSha256Hex(u.token_salt, token), u.token_hash)) return std::nullopt;
  auto role = ParseRole(u.role);
  if (!role.ok()) return std::nullopt;
  return Identity{.user = u.name, .team = u.team, .role = *role, .every_team = *role == Role::kAdmin};
}

std::optional<Identity> Authenticator::Resolve(std::string_view token, bool for_action) const {
  if (!token.empty()) {
    if (!client_token_.empty() && SecretEquals(token, client_token_)) {
      return Identity{.user = "admin", .role = Role::kAdmin, .every_team = true};
    }
    if (file_ != nullptr) {
      if (auto user = file_->Resolve(token)) return user;
    }
    if (auto user = UserOf(token)) return user;
  }
  const bool is_open = open();
  if (!for_action && !token.empty() && !view_token_.empty() && SecretEquals(token, view_token_) && !is_open) {
    return Identity{.user = "view-token", .role = Role::kViewer, .every_team = true};
  }
  if (is_open) return Identity{.user = "local", .role = Role::kAdmin, .every_team = true};
  return std::nullopt;
}

}  // namespace ft
