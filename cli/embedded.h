// Embedded single-node mode (`ftctl up`): ftd and one local ft-worker as
// child processes, state under the user's data directory.
//
// Finds ftd, ft-worker and ft-train next to ftctl (installed: one bin/
// directory) or in the build tree (daemon/, worker/, engine/). Waits until
// ftd serves, then starts the worker against the address ftd reports (so
// port 0 works), prints one line with the gRPC address, the dashboard URL and
// the data directory, and runs until SIGINT/SIGTERM or until either child
// exits; then stops both (SIGTERM, the worker first so its trainer
// checkpoints) and reaps them. Returns 0 after a requested stop, 1 when a
// child could not start or died on its own (its log names why: ftd.log and
// worker.log under the data directory).
#pragma once

#include <string>

namespace ft {

struct EmbeddedOptions {
  std::string data_dir;    // database, logs, worker scratch
  std::string listen;      // ftd's gRPC address (port 0 = any free port)
  std::string http;        // ftd's dashboard address ("" = off)
  std::string cpu_memory;  // what the local worker offers ("" = physical memory)
};

int RunEmbedded(const EmbeddedOptions& options);

}  // namespace ft
