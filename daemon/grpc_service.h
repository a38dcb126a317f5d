// gRPC front of the Daemon: the Jobs and Workers services (callback API; the
// worker session and Watch are reactors), with bearer-token checks and a cap
// on each client's open Watch and Logs streams. Every Jobs call is made by an
// identity (daemon/authorization.h: the client token, the view token or a
// user's token) and allowed or refused by Authorize: UNAUTHENTICATED for a
// missing or wrong token, PERMISSION_DENIED with Authorize's reason; lists,
// events and Watch carry only what the identity may read.
#pragma once

#include <memory>
#include <string>

#include "daemon/daemon.h"
#include "daemon/tokens_file.h"
#include "proto/ftune.grpc.pb.h"

namespace ft {

struct AuthOptions {
  std::string
      client_token;        // an admin named "admin"; with users, required of Jobs callers (see Authenticator)
  std::string view_token;  // a viewer of every team (ftd --http-view-token)
  std::string worker_token;                 // required from workers when non-empty
  const TokensFile* tokens_file = nullptr;  // ftd --tokens-file's users (outlives the services)
  // Watch and Logs streams one client (its address, without the port) may hold open at once; one
  // more is refused with RESOURCE_EXHAUSTED naming the cap (each costs ftd a buffer, Logs a thread).
  int max_streams_per_client = 64;
};

std::unique_ptr<ftune::v1::Jobs::CallbackService> MakeJobsService(Daemon* daemon, AuthOptions auth);
std::unique_ptr<ftune::v1::Workers::CallbackService> MakeWorkersService(Daemon* daemon, AuthOptions auth);

}  // namespace ft
