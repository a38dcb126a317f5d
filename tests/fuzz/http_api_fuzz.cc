// ftd's HTTP API without sockets (daemon/http_api.h): one request — method,
// target, the headers the API reads — through parsing, routing, the token
// rules and every handler's parameter checks, against a daemon holding one
// job. The input is "METHOD TARGET" then "Name: value" lines; "$JOB" in the
// target stands for the job's id; the first byte picks which tokens ftd has
// (and, for 4..7, an allowed host name). Each request's last path segment and
// ?job= value also go through the one job id rule (common/ids.h) and
// Daemon::LogPath: an id the rule takes must give a path inside DATA_DIR/logs,
// any other must be refused (abort = finding). Every request also goes to an
// API serving a dashboard directory that holds sources beside its assets: no
// answer may carry a source's bytes or the directory's path unless the request
// itself held them (abort = finding).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "common/ids.h"
#include "daemon/http_api.h"
#include "tests/fuzz/daemon_fixture.h"
#include "tests/fuzz/fuzz.h"

namespace {

constexpr const char* kSourceBytes = "SOURCE-NOT-AN-ASSET";

// A dashboard directory with its assets and, beside them, what must never be served.
const std::string& WebDir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    const std::string d = fs::path(ft::fuzz::ScratchFile("web.keep", "")).parent_path().string() + "/web";
    fs::create_directories(d + "/node_modules/uplot/dist");
    fs::create_directories(d + "/.git");
    std::ofstream(d + "/index.html") << "<!doctype html>";
    std::ofstream(d + "/app.js") << "1;";
    std::ofstream(d + "/node_modules/uplot/dist/uPlot.min.css") << ".u{}";
    for (const char* source : {"CMakeLists.txt", "package.json", ".gitignore", ".git/config", "app.js.map",
                               "node_modules/uplot/package.json", "node_modules/uplot/dist/LICENSE"}) {
      std::ofstream(d + "/" + source) << kSourceBytes;
    }
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<ft::fuzz::DaemonFixture> fixture = ft::fuzz::MakeDaemon("http");
  static const std::unique_ptr<ft::HttpApi> apis[8] = {
      std::make_unique<ft::HttpApi>(fixture->daemon.get(), ft::HttpApiOptions{"", "", "", false}),
      std::make_unique<ft::HttpApi>(fixture->daemon.get(), ft::HttpApiOptions{"ct", "", "", false}),
      std::make_unique<ft::HttpApi>(fixture->daemon.get(), ft::HttpApiOptions{"", "vt", "", true}),
      std::make_unique<ft::HttpApi>(fixture->daemon.get(), ft::HttpApiOptions{"ct", "vt", "", false}),
      std::make_unique<ft::HttpApi>(fixture->daemon.get(), ft::HttpApiOptions{"", "", "", false, {"h"}}),
      std::make_unique<ft::HttpApi>(fixture->daemon.get(), ft::HttpApiOptions{"ct", "", "", false, {"h"}}),
      std::make_unique<ft::HttpApi>(fixture->daemon.get(), ft::HttpApiOptions{"", "vt", "", true, {"h"}}),
      std::make_unique<ft::HttpApi>(fixture->daemon.get(), ft::HttpApiOptions{"ct", "vt", "", false, {"h"}})};
  if (size == 0) return 0;
  std::istringstream in(std::string(ft::fuzz::AsText(data + 1, size - 1)));
  ft::HttpRequest req;
  std::string line;
  std::getline(in, line);
  const size_t space = line.find(' ');
  req.method = line.substr(0, space);
  req.target = space == std::string::npos
                   ? "/"
                   : ft::fuzz::ReplaceAll(line.substr(space + 1), "$JOB", fixture->job_id);
  while (std::getline(in, line)) {
    const size_t colon = line.find(": ");
    if (colon == std::string::npos) continue;
    const std::string name = line.substr(0, colon), value = line.substr(colon + 2);
    if (name == "Authorization") req.authorization = value;
    if (name == "Cookie") req.cookie = value;
    if (name == "Last-Event-ID") req.last_event_id = value;
    if (name == "Origin") req.origin = value;
    if (name == "Host") req.host = value;
    if (name == "Sec-Fetch-Site") req.sec_fetch_site = value;
    if (name == "Content-Type") req.content_type = value;
  }
  (void)apis[data[0] % 8]->Handle(req);
  static const std::unique_ptr<ft::HttpApi> dashboard =
      std::make_unique<ft::HttpApi>(fixture->daemon.get(), ft::HttpApiOptions{"", "", WebDir(), false});
  const ft::HttpResponse page = dashboard->Handle(req);
  // A source served, or the web dir's path shown: unless the request itself holds those bytes
  // (an error may quote its request's target, or its Host lowercased).
  const std::string request(ft::fuzz::AsText(data, size));
  std::string lowered = request;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  for (const std::string& secret : {std::string(kSourceBytes), WebDir()}) {
    if (page.body.find(secret) != std::string::npos && request.find(secret) == std::string::npos &&
        lowered.find(secret) == std::string::npos)
      std::abort();
  }
  const std::string path = req.target.substr(0, req.target.find('?'));
  const size_t job = req.target.find("job=");
  for (const std::string& id : {path.substr(path.rfind('/') + 1),
                                job == std::string::npos ? std::string() : req.target.substr(job + 4)}) {
    auto log = fixture->daemon->LogPath(id);
    if (ft::IsValidJobId(id) != log.ok() || ft::CheckJobId(id, "id").ok() != log.ok()) std::abort();
    const std::string logs = fixture->daemon->options().data_dir + "/logs/";
    if (log.ok() && (log->compare(0, logs.size(), logs) != 0 || log->find("..") != std::string::npos ||
                     log->find('\0') != std::string::npos)) {
      std::abort();  // an id the rule takes named a file outside DATA_DIR/logs
    }
  }
  return 0;
}
