// The HTTP API of ftd (docs/HTTP_API.md): one endpoint table (method, path
// pattern, help, whether it changes state, allowed query parameters) and the
// handlers behind it, over ft::Daemon and its Store. Independent of the
// transport: daemon/http_server.h parses requests into HttpRequest and writes
// HttpResponse back (and runs the SSE stream for the endpoint marked so).
//
// Handle() never fails and never throws: every answer is a response. Errors
// are JSON `{"error": "..."}` naming what was wrong and how to fix it: 400 bad
// query parameter / malformed job id / bad path, 401 missing or wrong token,
// 403 cross-site action or refused by Authorize, 404 unknown path or job, 405 wrong method (with
// Allow), 409 cancel of a finished job, 421 a Host not served (DNS rebinding),
// 500 store errors, 503 /ready while the store is sticky-failed.
//
// Tokens: "Authorization: Bearer T", `?token=T`, or the `ftune_token` cookie
// (set when a page is fetched with a good ?token, so the page's own scripts
// and styles load; never accepted for actions). Each request's token is an
// identity (daemon/authorization.h: the client token, the view token or a
// user's); none is 401. What that identity may do on the job a request names
// is Authorize's one decision (403 with its reason), and lists, events and the
// stream carry only the jobs it may read. An ftd with neither a client token
// nor users is open, guarded only by the view token when one is set (as
// before users existed); /metrics, /healthz and /ready are always open.
//
// Browsers: everything but the open endpoints is answered only for a Host
// that is an IP address, localhost (or *.localhost) or one of allowed_hosts,
// else 421 (a DNS-rebinding page is another site under a name that resolves
// here). Actions are refused (403) when the browser marks them cross-site
// (Sec-Fetch-Site other than same-origin/none, an Origin that is not
// http(s)://<Host>), and, on an ftd without tokens, unless they carry
// `Content-Type: application/json` or an Authorization header: a page on
// another site cannot send either without a CORS preflight, which ftd never
// grants.
//
// Thread safety: Handle() may run concurrently on any threads.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "daemon/authorization.h"
#include "daemon/daemon.h"

namespace ft {

struct HttpRequest {
  std::string method;         // "GET", "POST", ...
  std::string target;         // as received: "/api/jobs?state=running"
  std::string authorization;  // the Authorization header ("" when absent)
  std::string cookie;         // the Cookie header
  std::string last_event_id;  // the Last-Event-ID header (SSE reconnects)
  // For refusing cross-site actions (a page on another site POSTing to ftd):
  std::string origin;          // the Origin header ("" when absent)
  std::string host;            // the Host header
  std::string sec_fetch_site;  // the Sec-Fetch-Site header a browser sends
  std::string content_type;    // the Content-Type header
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (Allow, Set-Cookie ...)
  // Set by GET /api/stream: the server answers with an SSE stream of this job's
  // updates ("" = every job), first replaying events with seq > after_seq
  // (-1 = no replay).
  bool stream = false;
  std::string stream_job;
  TeamScope stream_team;  // only this team's jobs and the worker events (nullopt = every job's)
  int64_t stream_after_seq = -1;
};

struct HttpApiOptions {
  std::string client_token;  // actions need it ("" = open)
  std::string view_token;    // reads under /api and pages need it ("" = open)
  // The dashboard's files; "" = no dashboard pages (404). Only its assets are
  // served (.html .js .mjs .css .svg .png .ico .woff2 at its top level, and
  // node_modules/uplot/dist's as /vendor/): never its sources, package files or
  // dotfiles, and a 404 names no filesystem path.
  std::string web_dir;
  bool tls = false;  // served over HTTPS (the token cookie is then Secure)
  // Host names served besides IP addresses and localhost (ftd's --http host
  // and --http-allowed-host); a port in a name is ignored.
  std::vector<std::string> allowed_hosts;
  const TokensFile* tokens_file = nullptr;  // ftd --tokens-file's users (outlives the API)
};

class HttpApi {
 public:
  enum class Access { kOpen, kView, kAction };
  struct Params;  // a request's parsed path captures and query parameters (http_api.cc)
  struct Endpoint {
    std::string method;
    std::string path;  // segments; "{id}" matches a job id, "{file}" one file name
    std::string help;
    bool changes_state = false;
    Access access = Access::kView;
    std::vector<std::string> params;  // allowed query parameters (besides "token")
    std::function<HttpResponse(const Params&)> handler;
  };

  HttpApi(Daemon* daemon, HttpApiOptions options);

  HttpResponse Handle(const HttpRequest& req);
  const std::vector<Endpoint>& endpoints() const { return endpoints_; }

  // The JobSummary JSON of one job (with its loss sparkline), as /api/jobs
  // lists it; for the SSE stream. NotFound for an unknown job.
  StatusOr<nlohmann::json> JobSummary(const std::string& job_id);
  StatusOr<nlohmann::json> JobSummary(const ftune::v1::Job& job);
  // The summaries of several jobs (in their order), with one sparkline query for all.
  StatusOr<std::vector<nlohmann::json>> JobSummaries(const std::vector<ftune::v1::Job>& jobs);
  // {"workers": [...]} as GET /api/workers answers it.
  StatusOr<nlohmann::json> Workers();

  static constexpr int kSparkPoints = 32;
  static constexpr int64_t kMaxLimit = 10'000;

 private:
  HttpResponse ListJobs(const Params& p);
  HttpResponse GetJob(const Params& p);
  HttpResponse JobMetrics(const Params& p);
  HttpResponse JobMemory(const Params& p);
  HttpResponse JobEvents(const Params& p);
  HttpResponse JobLog(const Params& p);
  HttpResponse CancelJob(const Params& p);
  HttpResponse ListWorkers(const Params& p);
  HttpResponse ListTeams(const Params& p);
  HttpResponse ListEvents(const Params& p);
  HttpResponse Stream(const Params& p);
  HttpResponse Metrics(const Params& p);
  HttpResponse Ready(const Params& p);
  HttpResponse EndpointList(const Params& p);
  HttpResponse StaticFile(const std::string& dir, const std::string& file);
  // The route table's groups (the constructor joins them in match order).
  std::vector<Endpoint> JobEndpoints();
  std::vector<Endpoint> ServiceEndpoints();
  std::vector<Endpoint> DashboardEndpoints();
  // A handler calling member `fn` of this HttpApi.
  std::function<HttpResponse(const Params&)> Bind(HttpResponse (HttpApi::*fn)(const Params&));

  // Refuses a request `e` may not take (cross-site action, missing or wrong token, a
  // query parameter it does not take); else sets *who to the caller and *cookie_token to
  // the token a ?token= carried (for the page's cookie; "" = none).
  std::optional<HttpResponse> Authenticate(const Endpoint& e, const HttpRequest& req,
                                           const std::map<std::string, std::string>& query, Identity* who,
                                           std::string* cookie_token) const;
  // Authenticate on an open ftd (no client token, no users): as before users existed.
  std::optional<HttpResponse> AuthenticateOpen(const Endpoint& e, const HttpRequest& req,
                                               const std::map<std::string, std::string>& query,
                                               std::string* cookie_token) const;
  // A 403 when p.who may not take `e` on the job it names ({id} or ?job=); the one
  // authorization decision (daemon/authorization.h).
  std::optional<HttpResponse> AuthorizeOn(const Endpoint& e, const Params& p);
  // Whether a request with this Host header may reach the API and pages.
  bool HostAllowed(const std::string& host_header) const;
  // A 403 for an action a page on another site could have sent; `token_guarded`:
  // the action needs a token (which such a page cannot know).
  std::optional<HttpResponse> RefuseCrossSite(const HttpRequest& req, bool token_guarded) const;
  // Whether the request carries `token` (header, query or cookie).
  static bool HasToken(const HttpRequest& req, const std::map<std::string, std::string>& query,
                       const std::string& token, bool allow_cookie);

  Daemon* daemon_;
  HttpApiOptions options_;
  Authenticator auth_;
  std::vector<Endpoint> endpoints_;
};

}  // namespace ft
