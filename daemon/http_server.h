// ftd's HTTP server (Boost.Beast over one Asio io_context with a small fixed
// thread pool): keep-alive HTTP/1.1 connections whose requests go to
// HttpApi::Handle, and Server-Sent Events streams for GET /api/stream.
//
// SSE fan-out: one broadcaster per server subscribes once to the daemon's
// live updates (Daemon::Subscribe(""), while at least one stream is open),
// serializes each update once and posts the same text to every stream that
// wants it (streams of one job get only that job's), so the cost per update
// does not grow with the number of open dashboards:
//   event: job      a JobSummary for each job the daemon published or whose
//                   progress moved (metrics arrived), coalesced by job id and
//                   built at most once per stream period for all streams
//                   together (one sparkline query for the changed jobs)
//   event: event    an Event, with "id: <seq>" (Last-Event-ID replays after it)
//   event: metric   {"job_id", step, loss, ...}
//   event: workers  {"workers": [...]}, polled once per period for all streams,
//                   sent when changed (streams of every job only)
//   ": keepalive"   a comment after keepalive_ms without other output.
// The daemon's callback only posts to the broadcaster's strand. Each stream's
// backlog (text posted to it and not yet written to its socket) is bounded
// by stream_max_bytes: a slow or stalled client past it is disconnected (it
// reconnects with Last-Event-ID), so a client can never block the daemon or
// the other streams.
//
// Limits: at most max_connections connections (SSE streams included) and
// max_streams SSE streams at once; past them a client gets 503 with a JSON
// error (an HTTPS connection over the connection limit is closed before the
// handshake). An accept error (EMFILE ...) is logged once and accepting is
// retried every 100 ms until it works again.
//
// HTTPS: with tls_cert_file and tls_key_file (ftd's --tls-cert/--tls-key) every
// connection is TLS 1.2+ (SSE streams too); a plaintext request to that port is
// answered 400 "this port serves HTTPS" and closed, and a failed handshake just
// closes its connection. Without them the server speaks plaintext HTTP.
//
// Start() fails (InvalidArgument for a malformed address or an unusable
// certificate/key, Unavailable when it cannot bind) before anything is served. Stop() (also run by the
// destructor) ends every subscription, closes the connections and joins the threads.
//
// Thread safety: Start/Stop from one thread; port() from any.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "daemon/daemon.h"
#include "daemon/http_api.h"

namespace ft {

struct HttpServerOptions {
  std::string address = "127.0.0.1:7071";  // HOST:PORT; port 0 picks a free port
  int threads = 2;                         // io threads (the machine may have only 2 cores)
  int64_t idle_timeout_ms = 60'000;        // a keep-alive connection silent this long is closed
  int64_t keepalive_ms = 15'000;           // SSE comment when a stream has been quiet this long
  int64_t stream_period_ms = 1'000;        // SSE: progress summaries and workers at most this often
  int64_t stream_max_bytes = int64_t{4}
                             << 20;  // SSE: text waiting for one client's socket before it is dropped
  int64_t max_connections = 512;     // open connections (SSE streams included); beyond: 503
  int64_t max_streams = 128;         // open SSE streams; beyond: 503
  std::string tls_cert_file;         // PEM certificate chain: serve HTTPS ("" = plaintext)
  std::string tls_key_file;          // its PEM private key
  int64_t tls_handshake_timeout_ms =
      10'000;  // a client that has not finished TLS setup (or shutdown) by then is closed
};

class HttpServer {
 public:
  // `daemon` and `api` must outlive the server.
  static StatusOr<std::unique_ptr<HttpServer>> Start(Daemon* daemon, HttpApi* api, HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void Stop();
  const std::string& host() const;   // as given in the address ("127.0.0.1")
  int port() const;                  // the bound port
  int64_t open_streams() const;      // SSE streams currently attached to the broadcaster
  int64_t open_connections() const;  // connections currently counted against max_connections
  // For tests: JobSummaries built for the streams since start (one per changed job per period).
  int64_t stream_summaries_built() const;
  bool tls() const;  // whether it serves HTTPS

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ft
