// Who may do what on ftd: identities resolved from bearer tokens, and the one
// authorization decision gRPC and HTTP both call (docs/OPERATIONS.md, "Users,
// teams and roles").
//
// Identities: ftd's --client-token (FTUNE_TOKEN) is an admin named "admin";
// --http-view-token is a viewer of every team named "view-token"; a user's
// token (Store users table, made by `ftctl admin user add`, or a line of ftd's
// --tokens-file: daemon/tokens_file.h) is that user. An ftd with neither a
// client token nor users is open: every caller is the admin "local" (one user
// on one machine, as before users existed).
//
// Roles: admin: everything, on every team. member: submit (the job is its
// team's), cancel and read its own team's jobs, logs and events. viewer: read
// its own team's jobs, logs and events; no action. The workers list is
// readable by every identity. What each action needs is one table
// (authorization.cc), not one rule per route.
//
// Thread safety: Authenticator is safe to call from any thread (it reads the
// store on every call, so a removed or rotated token stops working at once).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "daemon/store.h"

namespace ft {

enum class Role { kViewer = 0, kMember = 1, kAdmin = 2 };
const char* RoleName(Role role);
// "admin" | "member" | "viewer"; InvalidArgument naming the three otherwise.
StatusOr<Role> ParseRole(const std::string& name);

// Who makes a request.
struct Identity {
  std::string user;  // "admin" (client token), "view-token", "local" (open ftd), or a user's name
  std::string team;  // the user's team; "" with every_team
  Role role = Role::kViewer;
  bool every_team = false;  // reads and acts on every team's jobs (admins, the view token)
  // The jobs it may read: nullopt = every team's.
  TeamScope scope() const { return every_team ? TeamScope() : TeamScope(team); }
};

// What a caller asks to do. Job-scoped actions name the job's team.
enum class Action {
  kSubmit,       // submit a job (it becomes the submitter's team's)
  kReadJob,      // a job, its metrics, memory, log, events
  kCancel,       // cancel a job
  kListJobs,     // lists of jobs and events (filtered to what the identity may read)
  kReadWorkers,  // the workers list and pools
  kManageUsers,  // add, remove, rotate the token of, list users
  kReadTeams,    // the teams' quotas, weights and usage
  kManageTeams,  // set a team's quota and weight
  // Add, remove and list webhooks (their URLs may hold the receivers' secrets).
  kManageWebhooks,
};
const char* ActionName(Action action);

// Allowed, or refused with a reason naming the user, the action and why.
struct Decision {
  bool allowed = true;
  std::string reason;
};

// The one authorization decision. `job_team`/`job_id`: the job a job-scoped action is on
// (ignored by the others).
Decision Authorize(const Identity& who, Action action, std::string_view job_team = {},
                   std::string_view job_id = {});

// A user or team name: 1-64 characters of [A-Za-z0-9._-], starting with a letter or digit;
// InvalidArgument naming `what` ("user name", "team") and the rule otherwise.
Status CheckIdentityName(const std::string& name, const std::string& what);

// A new user token: "ftu_" + token_id + "_" + 48 random hex characters, and what the
// store keeps of it (token_id, a random salt, HMAC-SHA256(salt, token)).
struct IssuedToken {
  std::string token;  // shown once, never stored or logged
  std::string token_id, salt, hash;
};
StatusOr<IssuedToken> IssueToken();

// Resolves bearer tokens to identities.
class TokensFile;

class Authenticator {
 public:
  // `store` and `file` (nullptr: no --tokens-file) outlive this. Empty tokens are not configured.
  Authenticator(Store* store, std::string client_token, std::string view_token,
                const TokensFile* file = nullptr);

  // The identity holding `token` ("" = none sent); nullopt when none does. `for_action`: the
  // token is sent for a state change, which the view token (a read credential) never makes.
  std::optional<Identity> Resolve(std::string_view token, bool for_action = false) const;
  // Neither a client token nor users: every caller is the admin "local" (reads on HTTP also
  // need the view token when one is set, as before users existed).
  bool open() const;
  const std::string& client_token() const { return client_token_; }
  const std::string& view_token() const { return view_token_; }

 private:
  std::optional<Identity> UserOf(std::string_view token) const;

  Store* store_;
  const TokensFile* file_;
  const std::string client_token_;
  const std::string view_token_;
};

}  // namespace ft
