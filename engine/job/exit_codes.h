// ft-train's exit codes: the contract between the trainer and whoever runs
// it (ft-worker maps them to attempt outcomes, worker/attempt.cc; scripts
// read them too). Header-only, no dependencies.
#pragma once

namespace ft {

constexpr int kExitFinished = 0;
constexpr int kExitFailed = 1;
// The job's own input is wrong (a bad value, a missing data file, a path
// outside the allowed roots): another attempt would fail the same way.
constexpr int kExitBadInput = 2;
constexpr int kExitPreempted = 3;    // stopped after a checkpoint (a signal, a stop request)
constexpr int kExitSuperseded = 4;   // a newer epoch owns output.dir: stopped without writing
constexpr int kExitEnvironment = 5;  // I/O error, a system-owned file gone: not the job's fault
// One rank of a multi-rank run: a collective or the rendezvous failed (a peer
// rank vanished, never came, or the store's port was taken). The rank's own
// work was sound; what the attempt's outcome is depends on the other ranks.
constexpr int kExitRankLost = 6;

}  // namespace ft
