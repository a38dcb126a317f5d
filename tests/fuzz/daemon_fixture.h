// For the fuzz targets that drive ftd's core (http_api, daemon_session): a
// daemon on a scratch SQLite file with one submitted LoRA job of a tiny
// random model, on fake time.
#pragma once

#include <memory>
#include <string>

#include "common/clock.h"
#include "daemon/daemon.h"

namespace ft::fuzz {

struct DaemonFixture {
  FakeClock clock;
  std::unique_ptr<Daemon> daemon;
  std::string job_id;  // the submitted job
};

// A fresh daemon on `name`.sqlite (any previous one removed) with one job.
// Aborts when the fixture itself cannot be set up (not a finding).
std::unique_ptr<DaemonFixture> MakeDaemon(const std::string& name);

// Replaces every occurrence of `from` in `s` with `to`.
std::string ReplaceAll(std::string s, const std::string& from, const std::string& to);

}  // namespace ft::fuzz
