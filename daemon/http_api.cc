#include "daemon/http_api.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>

#include "common/ids.h"
#include "common/logging.h"
#include "common/secret.h"
#include "common/untrusted_text.h"
#include "daemon/json_views.h"
#include "daemon/prometheus.h"

namespace ft {

namespace fs = std::filesystem;
namespace pb = ftune::v1;
using nlohmann::json;

struct HttpApi::Params {
  const HttpRequest* req = nullptr;
  Identity who;                              // who asks (HttpApi::Authenticate)
  std::map<std::string, std::string> query;  // decoded
  std::string id;                            // the {id} segment
  std::string file;                          // the {file} segment
};

namespace {

constexpr int64_t kDefaultLogTail = 65'536;
constexpr int64_t kMaxLogTail = int64_t{16} << 20;
constexpr char kTokenCookie[] = "ftune_token";

HttpResponse Error(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.body = json{{"error", message}}.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

HttpResponse Json(const json& body) {
  HttpResponse r;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

// The HTTP status for a Status from the daemon or store.
HttpResponse FromStatus(const Status& s) {
  switch (s.code()) {
    case Status::Code::kNotFound: return Error(404, s.message());
    case Status::Code::kInvalidArgument: return Error(400, s.message());
    case Status::Code::kFailedPrecondition: return Error(409, s.message());
    case Status::Code::kUnavailable: return Error(503, s.message());
    default: return Error(500, s.ToString());
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX-decodes `in` ('+' is a space in query strings). False on a bad escape or a NUL.
bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;
      const int hi = HexValue(in[i + 1]), lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      c = static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (c == '+' && plus_is_space) {
      c = ' ';
    }
    if (c == '\0') return false;
    out->push_back(c);
  }
  return true;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

// A query parameter that must be an integer in [0, max]; `fallback` when absent.
StatusOr<int64_t> IntParam(const std::map<std::string, std::string>& query, const std::string& name,
                           int64_t fallback, int64_t max) {
  auto it = query.find(name);
  if (it == query.end()) return fallback;
  const std::string& v = it->second;
  const std::string hint =
      "query parameter '" + name + "' must be an integer from 0 to " + std::to_string(max);
  if (v.empty() || v.size() > 18 ||
      !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return Status::InvalidArgument(hint + ", not '" + v + "'");
  }
  const int64_t n = std::stoll(v);
  if (n > max) return Status::InvalidArgument(hint + "; " + v + " is too large");
  return n;
}

// The one job id rule (common/ids.h, IsValidJobId) as a 400.
HttpResponse BadJobId(const std::string& id) { return Error(400, CheckJobId(id, "job id").message()); }

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The host part of a Host header, lowercased, without its port or a trailing dot.
std::string HostName(const std::string& header) {
  std::string host = Lower(header);
  if (!host.empty() && host[0] == '[') {
    host = host.substr(1, host.find(']') == std::string::npos ? std::string::npos : host.find(']') - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));
  }
  if (!host.empty() && host.back() == '.') host.pop_back();
  return host;
}

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

HttpResponse Refused403(const std::string& why) {
  return Error(403, "cross-site request refused: " + why +
                        "; actions must come from the dashboard's own page or a non-browser client (curl, on "
                        "an ftd without tokens: add -H 'Content-Type: application/json')");
}

// The Content-Type of a dashboard asset, by its extension; nullopt for any
// other file (web/'s sources and build files: package.json, CMakeLists.txt ...).
std::optional<std::string> AssetType(const std::string& file) {
  static const std::map<std::string, std::string> kTypes = {{".html", "text/html; charset=utf-8"},
                                                            {".js", "text/javascript; charset=utf-8"},
                                                            {".mjs", "text/javascript; charset=utf-8"},
                                                            {".css", "text/css; charset=utf-8"},
                                                            {".svg", "image/svg+xml"},
                                                            {".png", "image/png"},
                                                            {".ico", "image/x-icon"},
                                                            {".woff2", "font/woff2"}};
  auto it = kTypes.find(fs::path(file).extension().string());
  if (it == kTypes.end()) return std::nullopt;
  return it->second;
}

// The value of cookie `name` in a Cookie header ("" when absent).
std::string CookieValue(const std::string& header, const std::string& name) {
  for (std::string part : Split(header, ';')) {
    part.erase(0, part.find_first_not_of(' '));
    if (part.compare(0, name.size() + 1, name + "=") == 0) return part.substr(name.size() + 1);
  }
  return "";
}

}  // namespace

HttpApi::HttpApi(Daemon* daemon, HttpApiOptions options)
    : daemon_(daemon),
      options_(std::move(options)),
      auth_(&daemon->store(), options_.client_token, options_.view_token, options_.tokens_file) {
  // In match order: the dashboard's catch-all "/{file}" comes last.
  for (auto group : {&HttpApi::JobEndpoints, &HttpApi::ServiceEndpoints, &HttpApi::DashboardEndpoints}) {
    for (Endpoint& e : (this->*group)()) endpoints_.push_back(std::move(e));
  }
}

std::function<HttpResponse(const HttpApi::Params&)> HttpApi::Bind(
    HttpResponse (HttpApi::*fn)(const Params&)) {
  return [this, fn](const Params& p) { return (this->*fn)(p); };
}

// The endpoint table and the job API.
std::vector<HttpApi::Endpoint> HttpApi::JobEndpoints() {
  return {
      {"GET", "/api/endpoints", "this table", false, Access::kView, {}, Bind(&HttpApi::EndpointList)},
      {"GET",
       "/api/jobs",
       "jobs, newest first, with counts per state; ?state=a,b&q=substring&limit=N",
       false,
       Access::kView,
       {"state", "q", "limit"},
       Bind(&HttpApi::ListJobs)},
      {"GET",
       "/api/jobs/{id}",
       "one job: summary, attempts, plan, spec, predicted memory",
       false,
       Access::kView,
       {},
       Bind(&HttpApi::GetJob)},
      {"GET",
       "/api/jobs/{id}/metrics",
       "training metrics in step order; ?after_step=N&limit=N",
       false,
       Access::kView,
       {"after_step", "limit"},
       Bind(&HttpApi::JobMetrics)},
      {"GET",
       "/api/jobs/{id}/memory",
       "device memory samples and the planner's prediction; ?after_ms=N&limit=N",
       false,
       Access::kView,
       {"after_ms", "limit"},
       Bind(&HttpApi::JobMemory)},
      {"GET",
       "/api/jobs/{id}/events",
       "the job's events; ?after_seq=N&limit=N",
       false,
       Access::kView,
       {"after_seq", "limit"},
       Bind(&HttpApi::JobEvents)},
      {"GET",
       "/api/jobs/{id}/log",
       "the tail of the job's log (text); ?tail_bytes=N",
       false,
       Access::kView,
       {"tail_bytes"},
       Bind(&HttpApi::JobLog)},
      {"POST",
       "/api/jobs/{id}/cancel",
       "cancel the job (checkpoint and stop if running)",
       true,
       Access::kAction,
       {},
       Bind(&HttpApi::CancelJob)},
  };
}

// Workers, all events, the live stream, and what monitors read.
std::vector<HttpApi::Endpoint> HttpApi::ServiceEndpoints() {
  return {
      {"GET",
       "/api/workers",
       "workers with their devices",
       false,
       Access::kView,
       {},
       Bind(&HttpApi::ListWorkers)},
      {"GET",
       "/api/teams",
       "teams: quota, weight, devices running and borrowed, queued jobs, decayed usage, fair share",
       false,
       Access::kView,
       {},
       Bind(&HttpApi::ListTeams)},
      {"GET",
       "/api/events",
       "events of every job (or ?job=ID); ?after_seq=N&limit=N",
       false,
       Access::kView,
       {"job", "after_seq", "limit"},
       Bind(&HttpApi::ListEvents)},
      {"GET",
       "/api/stream",
       "server-sent events: job, event, metric, workers; ?job=ID&after_seq=N",
       false,
       Access::kView,
       {"job", "after_seq"},
       Bind(&HttpApi::Stream)},
      {"GET",
       "/metrics",
       "Prometheus metrics (text format 0.0.4)",
       false,
       Access::kOpen,
       {},
       Bind(&HttpApi::Metrics)},
      {"GET",
       "/healthz",
       "200 while the process serves",
       false,
       Access::kOpen,
       {},
       [](const Params&) {
         HttpResponse r;
         r.content_type = "text/plain; charset=utf-8";
         r.body = "ok\n";
         return r;
       }},
      {"GET",
       "/ready",
       "200 while the store accepts writes, else 503 with the reason",
       false,
       Access::kOpen,
       {},
       Bind(&HttpApi::Ready)},
  };
}

// The dashboard's page and files.
std::vector<HttpApi::Endpoint> HttpApi::DashboardEndpoints() {
  return {
      {"GET",
       "/",
       "the dashboard",
       false,
       Access::kView,
       {},
       [this](const Params&) { return StaticFile(options_.web_dir, "index.html"); }},
      {"GET",
       "/vendor/{file}",
       "the chart library's files",
       false,
       Access::kView,
       {},
       [this](const Params& p) {
         return StaticFile((fs::path(options_.web_dir) / "node_modules" / "uplot" / "dist").string(), p.file);
       }},
      {"GET",
       "/{file}",
       "the dashboard's files",
       false,
       Access::kView,
       {},
       [this](const Params& p) { return StaticFile(options_.web_dir, p.file); }},
  };
}

bool HttpApi::HasToken(const HttpRequest& req, const std::map<std::string, std::string>& query,
                       const std::string& token, bool allow_cookie) {
  if (SecretEquals(req.authorization, "Bearer " + token)) return true;
  auto it = query.find("token");
  if (it != query.end() && SecretEquals(it->second, token)) return true;
  return allow_cookie && SecretEquals(CookieValue(req.cookie, kTokenCookie), token);
}

namespace {

// Splits the request target into its decoded path, segments and query; a 400
// response for a bad path or escape.
std::optional<HttpResponse> ParseTarget(const HttpRequest& req, std::string* path,
                                        std::vector<std::string>* segments,
                                        std::map<std::string, std::string>* query) {
  const size_t qmark = req.target.find('?');
  const std::string raw = req.target.substr(0, qmark);
  if (!PercentDecode(raw, false, path) || path->empty() || (*path)[0] != '/') {
    return Error(400, "bad request path '" + req.target + "': use an absolute path with valid %XX escapes");
  }
  // Split before decoding: an encoded '/' stays inside its segment (a job id
  // "..%2Fx" is one malformed id, not two segments).
  *segments = Split(raw.substr(1), '/');
  for (std::string& segment : *segments) {
    std::string decoded;
    (void)PercentDecode(segment, false, &decoded);  // the whole path decoded above
    segment = std::move(decoded);
  }
  if (qmark != std::string::npos) {
    for (const std::string& pair : Split(req.target.substr(qmark + 1), '&')) {
      if (pair.empty()) continue;
      const size_t eq = pair.find('=');
      std::string key, value;
      if (!PercentDecode(pair.substr(0, eq), true, &key) ||
          !PercentDecode(eq == std::string::npos ? "" : pair.substr(eq + 1), true, &value)) {
        return Error(400, "bad query string in '" + req.target + "': invalid %XX escape");
      }
      (*query)[key] = value;
    }
  }
  if (segments->size() == 1 && (*segments)[0].empty()) segments->clear();  // "/"
  for (const std::string& s : *segments) {
    if (s == ".." || s == ".") return Error(400, "bad path '" + *path + "': '.' and '..' are not allowed");
  }
  return std::nullopt;
}

// Whether `e`'s path matches `segments`, with its {id} and {file} captures.
bool Matches(const HttpApi::Endpoint& e, const std::vector<std::string>& segments,
             HttpApi::Params* captures) {
  std::vector<std::string> pattern = Split(e.path.substr(1), '/');
  if (pattern.size() == 1 && pattern[0].empty()) pattern.clear();
  if (pattern.size() != segments.size()) return false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == "{id}") {
      captures->id = segments[i];
    } else if (pattern[i] == "{file}") {
      captures->file = segments[i];
    } else if (pattern[i] != segments[i]) {
      return false;
    }
  }
  return true;
}

// The endpoint of `method` on `segments` (the first in table order), with its
// captures in *p; else a 405 naming the methods the path takes, or a 404.
StatusOr<const HttpApi::Endpoint*> Route(const std::vector<HttpApi::Endpoint>& endpoints,
                                         const std::string& method, const std::string& path,
                                         const std::vector<std::string>& segments, HttpApi::Params* p,
                                         HttpResponse* refusal) {
  std::vector<std::string> allowed;
  for (const HttpApi::Endpoint& e : endpoints) {
    HttpApi::Params c;
    if (!Matches(e, segments, &c)) continue;
    if (e.method == method) {
      p->id = c.id;
      p->file = c.file;
      return &e;
    }
    if (std::find(allowed.begin(), allowed.end(), e.method) == allowed.end()) allowed.push_back(e.method);
  }
  if (allowed.empty()) {
    *refusal = Error(404, "no endpoint " + method + " " + path + "; GET /api/endpoints lists them");
    return Status::NotFound("no endpoint");
  }
  std::string allow;
  for (const std::string& m : allowed) allow += (allow.empty() ? "" : ", ") + m;
  *refusal = Error(405, method + " is not allowed on " + path + "; use " + allow);
  refusal->headers.emplace_back("Allow", allow);
  return Status::InvalidArgument("method not allowed");
}

}  // namespace

bool HttpApi::HostAllowed(const std::string& host_header) const {
  const std::string host = HostName(host_header);
  const std::string suffix = ".localhost";
  if (host.empty() || host == "localhost" || IsIpLiteral(host) ||
      (host.size() > suffix.size() &&
       host.compare(host.size() - suffix.size(), suffix.size(), suffix) == 0)) {
    return true;
  }
  return std::any_of(options_.allowed_hosts.begin(), options_.allowed_hosts.end(),
                     [&](const std::string& allowed) { return HostName(allowed) == host; });
}

std::optional<HttpResponse> HttpApi::RefuseCrossSite(const HttpRequest& req, bool token_guarded) const {
  const std::string& site = req.sec_fetch_site;
  if (!site.empty() && site != "same-origin" && site != "none") {
    return Refused403("the browser marks it Sec-Fetch-Site: " + EscapeControlChars(site, 64));
  }
  const std::string origin = Lower(req.origin), self = Lower(req.host);
  if (!origin.empty()) {
    if (self.empty() || (origin != "http://" + self && origin != "https://" + self)) {
      return Refused403("its Origin '" + EscapeControlChars(req.origin, 128) + "' is not this server ('" +
                        EscapeControlChars(req.host, 128) + "')");
    }
  }
  // A form or a simple fetch() from any page can send neither of these without
  // a CORS preflight, which ftd never grants.
  const bool json = Lower(req.content_type).rfind("application/json", 0) == 0;
  if (!token_guarded && req.authorization.empty() && !json) {
    return Refused403(
        "without a token, an Authorization header or 'Content-Type: application/json' it is a "
        "request any page on another site can send");
  }
  return std::nullopt;
}

namespace {

constexpr char kActionNeedsToken[] =
    "this action needs the client token or a member's or admin's token: send 'Authorization: Bearer <token>' "
    "or ?token=<token> (ftd --client-token / FTUNE_TOKEN, or ftctl admin user add)";
constexpr char kViewNeedsToken[] =
    "viewing needs a token (this ftd has a client or view token): send 'Authorization: Bearer "
    "<token>', ?token=<token> or open the dashboard as /?token=<token>, with the view token "
    "(ftd --http-view-token), the client token (ftd --client-token / FTUNE_TOKEN) or a user's token";

// What an endpoint asks to do (daemon/authorization.h), from its table row.
Action ActionOf(const HttpApi::Endpoint& e) {
  if (e.changes_state) return Action::kCancel;  // the one action the API has
  if (e.path.find("{id}") != std::string::npos) return Action::kReadJob;
  if (e.path == "/api/workers") return Action::kReadWorkers;
  if (e.path == "/api/teams") return Action::kReadTeams;
  return Action::kListJobs;  // lists and pages: what they show is filtered by the caller's teams
}

// A token is echoed into a Set-Cookie header only when it cannot break the header.
bool CookieSafe(const std::string& token) {
  return !token.empty() && token.size() <= 256 && std::all_of(token.begin(), token.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

}  // namespace

std::optional<HttpResponse> HttpApi::AuthenticateOpen(const Endpoint& e, const HttpRequest& req,
                                                      const std::map<std::string, std::string>& query,
                                                      std::string* cookie_token) const {
  // No client token and no users: only the view token guards, actions (never from the
  // cookie) as well as reads (docs/HTTP_API.md, "Tokens").
  const std::string& needed = options_.view_token;
  if (e.access == Access::kAction) {
    if (auto refused = RefuseCrossSite(req, !needed.empty())) return refused;
    if (!needed.empty() && !HasToken(req, query, needed, false)) return Error(401, kActionNeedsToken);
  }
  if (e.access == Access::kView && !needed.empty()) {
    if (!HasToken(req, query, needed, true)) return Error(401, kViewNeedsToken);
    auto query_token = query.find("token");
    if (query_token != query.end() && SecretEquals(query_token->second, needed)) *cookie_token = needed;
  }
  return std::nullopt;
}

std::optional<HttpResponse> HttpApi::Authenticate(const Endpoint& e, const HttpRequest& req,
                                                  const std::map<std::string, std::string>& query,
                                                  Identity* who, std::string* cookie_token) const {
  for (const auto& [key, value] : query) {
    if (key == "token" || std::find(e.params.begin(), e.params.end(), key) != e.params.end()) continue;
    std::string takes;
    for (const std::string& a : e.params) takes += (takes.empty() ? "" : ", ") + a;
    return Error(400, "unknown query parameter '" + EscapeControlChars(key, 64) + "' for " + e.method + " " +
                          e.path + (takes.empty() ? "; it takes none" : "; it takes: " + takes));
  }
  if (e.access == Access::kOpen) return std::nullopt;
  if (auth_.open()) {
    *who = Identity{.user = "local", .role = Role::kAdmin, .every_team = true};
    return AuthenticateOpen(e, req, query, cookie_token);
  }
  const bool action = e.access == Access::kAction;
  if (action) {
    if (auto refused = RefuseCrossSite(req, true)) return refused;
  }
  // The token by header, then query, then (reads only) the page's cookie: the first that is someone's.
  const std::string bearer = req.authorization.rfind("Bearer ", 0) == 0 ? req.authorization.substr(7) : "";
  auto query_token = query.find("token");
  const std::string from_query = query_token == query.end() ? "" : query_token->second;
  for (const std::string* token : {&bearer, &from_query}) {
    if (token->empty()) continue;
    if (auto id = auth_.Resolve(*token, action)) {
      *who = *id;
      if (token == &from_query && CookieSafe(from_query)) *cookie_token = from_query;
      return std::nullopt;
    }
  }
  if (!action) {
    if (auto id = auth_.Resolve(CookieValue(req.cookie, kTokenCookie))) {
      *who = *id;
      return std::nullopt;
    }
  }
  return Error(401, action ? kActionNeedsToken : kViewNeedsToken);
}

std::optional<HttpResponse> HttpApi::AuthorizeOn(const Endpoint& e, const Params& p) {
  std::string job_id = p.id;
  if (auto it = p.query.find("job"); job_id.empty() && it != p.query.end()) job_id = it->second;
  Action action = ActionOf(e);
  if (!job_id.empty() && action == Action::kListJobs) action = Action::kReadJob;  // ?job= on a list
  std::string team;
  if (!job_id.empty()) {
    if (!IsValidJobId(job_id)) return std::nullopt;  // the handler answers 400
    auto job = daemon_->store().GetJob(job_id);
    if (!job.ok()) return std::nullopt;  // the handler answers 404
    team = job->team;
  }
  const Decision d = Authorize(p.who, action, team, job_id);
  if (d.allowed) return std::nullopt;
  FT_LOG(INFO) << "http: refused: " << EscapeControlChars(d.reason, 512);
  return Error(403, d.reason);
}

HttpResponse HttpApi::Handle(const HttpRequest& req) {
  std::string path;
  std::vector<std::string> segments;
  Params p;
  p.req = &req;
  if (auto bad = ParseTarget(req, &path, &segments, &p.query)) return *bad;
  HttpResponse refusal;
  StatusOr<const Endpoint*> found = Route(endpoints_, req.method, path, segments, &p, &refusal);
  if (!found.ok()) return refusal;
  if ((*found)->access != Access::kOpen && !HostAllowed(req.host)) {
    // DNS rebinding: a page whose name resolves to this address is another site.
    return Error(421,
                 "Host '" + EscapeControlChars(req.host, 128) +
                     "' is not served here: ftd answers its API and pages only for IP addresses, localhost "
                     "and the names given with --http-allowed-host; to open it under this name, start ftd "
                     "with --http-allowed-host " +
                     EscapeControlChars(HostName(req.host), 128));
  }
  std::string cookie_token;  // the token a ?token= carried, when it is someone's
  if (auto refused = Authenticate(**found, req, p.query, &p.who, &cookie_token)) return *refused;
  if ((*found)->access != Access::kOpen) {
    if (auto refused = AuthorizeOn(**found, p)) return *refused;
  }
  HttpResponse r = (*found)->handler(p);
  const bool is_page = (*found)->path.rfind("/api/", 0) != 0;
  if (is_page && !cookie_token.empty() && r.status == 200) {
    // The page's scripts and styles load without a token in their URLs. The value is a
    // token that resolved to an identity and is only [A-Za-z0-9_.-] (no header injection).
    r.headers.emplace_back("Set-Cookie", std::string(kTokenCookie) + "=" + cookie_token +
                                             "; Path=/; HttpOnly; SameSite=Strict" +
                                             (options_.tls ? "; Secure" : ""));
  }
  return r;
}

// ------------------------------------------------------------------ helpers for the stream

StatusOr<json> HttpApi::JobSummary(const pb::Job& job) {
  FT_ASSIGN_OR_RETURN(auto sparks, daemon_->store().LossSparklines({job.id()}, kSparkPoints));
  auto it = sparks.find(job.id());
  return JobSummaryJson(job, it == sparks.end() ? std::vector<double>() : it->second);
}

StatusOr<json> HttpApi::JobSummary(const std::string& job_id) {
  FT_ASSIGN_OR_RETURN(pb::Job job, daemon_->GetJob(job_id));
  return JobSummary(job);
}

StatusOr<std::vector<json>> HttpApi::JobSummaries(const std::vector<ftune::v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const pb::Job& j : jobs) ids.push_back(j.id());
  FT_ASSIGN_OR_RETURN(auto sparks, daemon_->store().LossSparklines(ids, kSparkPoints));
  std::vector<json> out;
  for (const pb::Job& j : jobs) {
    auto it = sparks.find(j.id());
    out.push_back(JobSummaryJson(j, it == sparks.end() ? std::vector<double>() : it->second));
  }
  return out;
}

StatusOr<json> HttpApi::Workers() {
  FT_ASSIGN_OR_RETURN(pb::ListWorkersReply reply, daemon_->ListWorkers());
  json workers = json::array();
  for (const pb::WorkerInfo& w : reply.workers()) workers.push_back(WorkerJson(w));
  return json{{"workers", std::move(workers)},
              {"pools", PoolsJson(daemon_->attempt_history(), daemon_->live_pools())}};
}

// ------------------------------------------------------------------ handlers

HttpResponse HttpApi::EndpointList(const Params&) {
  json list = json::array();
  for (const Endpoint& e : endpoints_) {
    list.push_back(
        {{"method", e.method}, {"path", e.path}, {"help", e.help}, {"changes_state", e.changes_state}});
  }
  return Json({{"endpoints", std::move(list)}});
}

HttpResponse HttpApi::ListJobs(const Params& p) {
  std::vector<JobStateCode> states;
  if (auto it = p.query.find("state"); it != p.query.end()) {
    for (const std::string& name : Split(it->second, ',')) {
      pb::JobState state;
      if (!ParseJobStateName(name, &state)) {
        return Error(400, "query parameter 'state': unknown state '" + name +
                              "'; use a comma-separated list of queued, running, preempted, succeeded, "
                              "failed, cancelled");
      }
      states.push_back(static_cast<JobStateCode>(static_cast<int>(state)));
    }
  }
  auto limit = IntParam(p.query, "limit", kMaxLimit, kMaxLimit);
  if (!limit.ok()) return Error(400, limit.status().message());
  const std::string q = p.query.count("q") ? p.query.at("q") : "";
  // Filter, order and limit in SQL: only the page's rows are read and converted.
  auto jobs = daemon_->ListJobsNewest(states, q, *limit ? *limit : kMaxLimit, p.who.scope());
  if (!jobs.ok()) return FromStatus(jobs.status());
  auto totals = daemon_->store().Totals();
  if (!totals.ok()) return FromStatus(totals.status());
  std::vector<std::string> ids;
  for (const pb::Job& j : *jobs) ids.push_back(j.id());
  auto sparks = daemon_->store().LossSparklines(ids, kSparkPoints);
  if (!sparks.ok()) return FromStatus(sparks.status());
  json list = json::array();
  for (const pb::Job& j : *jobs) {
    auto it = sparks->find(j.id());
    list.push_back(JobSummaryJson(j, it == sparks->end() ? std::vector<double>() : it->second));
  }
  json counts = json::object();
  for (const auto& [state, n] : totals->jobs_by_state) {
    counts[JobStateName(static_cast<pb::JobState>(static_cast<int>(state)))] = n;
  }
  return Json({{"jobs", std::move(list)}, {"counts", std::move(counts)}});
}

HttpResponse HttpApi::GetJob(const Params& p) {
  if (!IsValidJobId(p.id)) return BadJobId(p.id);
  auto job = daemon_->GetJob(p.id);
  if (!job.ok()) return FromStatus(job.status());
  auto attempts = daemon_->store().ListAttempts(p.id);
  if (!attempts.ok()) return FromStatus(attempts.status());
  auto sparks = daemon_->store().LossSparklines({p.id}, kSparkPoints);
  if (!sparks.ok()) return FromStatus(sparks.status());
  auto predicted = daemon_->PredictedBytes(p.id);
  if (!predicted.ok())
    FT_LOG(DEBUG) << "predicted bytes of " << p.id << ": " << predicted.status().ToString();
  auto it = sparks->find(p.id);
  return Json(JobDetailJson(*job, *attempts, it == sparks->end() ? std::vector<double>() : it->second,
                            predicted.ok() ? *predicted : 0));
}

HttpResponse HttpApi::JobMetrics(const Params& p) {
  if (!IsValidJobId(p.id)) return BadJobId(p.id);
  auto after = IntParam(p.query, "after_step", 0, INT64_MAX / 2);
  if (!after.ok()) return Error(400, after.status().message());
  auto limit = IntParam(p.query, "limit", kMaxLimit, kMaxLimit);
  if (!limit.ok()) return Error(400, limit.status().message());
  if (auto j = daemon_->store().GetJob(p.id); !j.ok()) return FromStatus(j.status());
  auto rows = daemon_->store().ListMetrics(p.id, *after, *limit ? *limit : kMaxLimit);
  if (!rows.ok()) return FromStatus(rows.status());
  json points = json::array();
  for (const MetricRow& m : *rows) points.push_back(MetricJson(m));
  return Json({{"points", std::move(points)}});
}

HttpResponse HttpApi::JobMemory(const Params& p) {
  if (!IsValidJobId(p.id)) return BadJobId(p.id);
  auto after = IntParam(p.query, "after_ms", 0, INT64_MAX / 2);
  if (!after.ok()) return Error(400, after.status().message());
  auto limit = IntParam(p.query, "limit", kMaxLimit, kMaxLimit);
  if (!limit.ok()) return Error(400, limit.status().message());
  if (auto j = daemon_->store().GetJob(p.id); !j.ok()) return FromStatus(j.status());
  auto rows = daemon_->store().ListDeviceMemory(p.id, *after, *limit ? *limit : kMaxLimit);
  if (!rows.ok()) return FromStatus(rows.status());
  auto predicted = daemon_->PredictedBytes(p.id);
  json samples = json::array();
  for (const DeviceMemoryRow& d : *rows) samples.push_back(DeviceMemoryJson(d));
  return Json({{"predicted_bytes", predicted.ok() ? *predicted : 0}, {"samples", std::move(samples)}});
}

HttpResponse HttpApi::JobEvents(const Params& p) {
  if (!IsValidJobId(p.id)) return BadJobId(p.id);
  if (auto j = daemon_->store().GetJob(p.id); !j.ok()) return FromStatus(j.status());
  Params all = p;
  all.query["job"] = p.id;
  return ListEvents(all);
}

HttpResponse HttpApi::ListEvents(const Params& p) {
  auto after = IntParam(p.query, "after_seq", 0, INT64_MAX / 2);
  if (!after.ok()) return Error(400, after.status().message());
  auto limit = IntParam(p.query, "limit", kMaxLimit, kMaxLimit);
  if (!limit.ok()) return Error(400, limit.status().message());
  pb::ListEventsRequest req;
  if (auto it = p.query.find("job"); it != p.query.end() && !it->second.empty()) {
    if (!IsValidJobId(it->second)) return BadJobId(it->second);
    if (auto j = daemon_->store().GetJob(it->second); !j.ok()) return FromStatus(j.status());
    req.set_job_id(it->second);
  }
  req.set_after_seq(*after);
  req.set_limit(*limit ? *limit : kMaxLimit);
  auto reply = daemon_->ListEvents(req, p.who.scope());
  if (!reply.ok()) return FromStatus(reply.status());
  json events = json::array();
  for (const pb::Event& e : reply->events()) events.push_back(EventJson(e));
  return Json({{"events", std::move(events)}});
}

HttpResponse HttpApi::JobLog(const Params& p) {
  if (!IsValidJobId(p.id)) return BadJobId(p.id);
  auto tail = IntParam(p.query, "tail_bytes", kDefaultLogTail, kMaxLogTail);
  if (!tail.ok()) return Error(400, tail.status().message());
  if (auto j = daemon_->store().GetJob(p.id); !j.ok()) return FromStatus(j.status());
  HttpResponse r;
  r.content_type = "text/plain; charset=utf-8";
  auto path = daemon_->LogPath(p.id);
  if (!path.ok()) return FromStatus(path.status());
  std::ifstream in(*path, std::ios::binary | std::ios::ate);
  if (!in) return r;  // no log yet
  const std::streamoff size = in.tellg();
  const std::streamoff start = std::max<std::streamoff>(0, size - *tail);
  in.seekg(start);
  r.body.resize(static_cast<size_t>(size - start));
  in.read(r.body.data(), size - start);
  r.body.resize(static_cast<size_t>(in.gcount()));
  return r;
}

HttpResponse HttpApi::CancelJob(const Params& p) {
  if (!IsValidJobId(p.id)) return BadJobId(p.id);
  auto job = daemon_->Cancel(p.id, {p.who.user, p.who.team});
  if (!job.ok()) return FromStatus(job.status());
  FT_LOG(INFO) << "http: job " << p.id << " cancelled";
  return GetJob(p);
}

HttpResponse HttpApi::ListWorkers(const Params&) {
  auto workers = Workers();
  if (!workers.ok()) return FromStatus(workers.status());
  return Json(*workers);
}

HttpResponse HttpApi::ListTeams(const Params&) {
  auto teams = daemon_->ListTeams();
  if (!teams.ok()) return FromStatus(teams.status());
  json out = json::array();
  for (const TeamInfo& t : *teams) {
    out.push_back({{"name", t.name},
                   {"quota_devices", t.quota_devices},
                   {"weight", t.weight},
                   {"running_devices", t.running_devices},
                   {"borrowed_devices", t.borrowed_devices},
                   {"queued_jobs", t.queued_jobs},
                   {"max_queued", t.max_queued},
                   {"usage_device_seconds", t.usage_device_seconds},
                   {"fair_share", t.fair_share},
                   {"spend", t.spend},
                   {"budget", t.budget ? json(*t.budget) : json(nullptr)}});
  }
  return Json({{"teams", std::move(out)}});
}

HttpResponse HttpApi::Stream(const Params& p) {
  HttpResponse r;
  if (auto it = p.query.find("job"); it != p.query.end() && !it->second.empty()) {
    if (!IsValidJobId(it->second)) return BadJobId(it->second);
    if (auto j = daemon_->store().GetJob(it->second); !j.ok()) return FromStatus(j.status());
    r.stream_job = it->second;
  }
  auto after = IntParam(p.query, "after_seq", -1, INT64_MAX / 2);
  if (!after.ok()) return Error(400, after.status().message());
  r.stream_after_seq = *after;
  if (!p.req->last_event_id.empty()) {
    std::map<std::string, std::string> header = {{"Last-Event-ID", p.req->last_event_id}};
    auto last = IntParam(header, "Last-Event-ID", -1, INT64_MAX / 2);
    if (!last.ok()) {
      return Error(400, "header Last-Event-ID must be an event seq (a non-negative integer), not '" +
                            p.req->last_event_id + "'");
    }
    r.stream_after_seq = std::max(r.stream_after_seq, *last);
  }
  r.stream = true;
  r.stream_team = p.who.scope();
  r.content_type = "text/event-stream";
  return r;
}

HttpResponse HttpApi::Metrics(const Params&) {
  auto text = RenderPrometheus(*daemon_);
  if (!text.ok()) return FromStatus(text.status());
  HttpResponse r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = std::move(*text);
  return r;
}

HttpResponse HttpApi::Ready(const Params&) {
  // Daemon::Ready checks the database's files first: a deleted or replaced -wal is said here.
  Status s = daemon_->Ready();
  if (!s.ok()) return Error(503, "not ready: ftd refuses writes: " + s.ToString());
  HttpResponse r;
  r.content_type = "text/plain; charset=utf-8";
  r.body = "ready\n";
  return r;
}

HttpResponse HttpApi::StaticFile(const std::string& dir, const std::string& file) {
  if (options_.web_dir.empty()) {
    return Error(404, "no dashboard: ftd found no web directory (pass --web-dir DIR)");
  }
  if (file.find('/') != std::string::npos || file.find('\\') != std::string::npos) {
    return Error(400, "bad file name '" + file + "'");
  }
  // Only the dashboard's assets (never a dotfile or a source), and no filesystem path in the answer.
  const std::optional<std::string> type = AssetType(file);
  const fs::path path = fs::path(dir) / file;
  std::error_code ec;
  if (file.empty() || file[0] == '.' || !type || !fs::is_regular_file(path, ec)) {
    return Error(404, "no file '" + file + "' in the dashboard");
  }
  std::ifstream in(path, std::ios::binary);
  HttpResponse r;
  r.body.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    FT_LOG(WARN) << "http: cannot read the dashboard's " << path.string();
    return Error(500, "cannot read the dashboard's '" + file + "'");
  }
  r.content_type = *type;
  r.headers.emplace_back("Cache-Control", "no-cache");
  return r;
}

}  // namespace ft
