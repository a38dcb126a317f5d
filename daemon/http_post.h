// One HTTP(S) POST made asynchronously on an io_context (Boost.Beast), for ftd's webhooks.
//
// https:// verifies the receiver's certificate chain against the TLS context's trust store (the
// system's CA store unless the caller loaded another) and its name against the URL's host (RFC
// 2818), and sends the host as SNI. Redirects are not followed (a 3xx is an answer like any
// other). The whole request (resolve, connect, TLS handshake, write, the answer) must end within
// `timeout`; past it the connection is closed.
//
// Success and failure: `done` is called exactly once, on the io_context's thread, with the answer's
// status code (200, 500 ...) and "" — or with 0 and why there was no answer (refused, timed out
// after N ms, a certificate that does not verify, ...). A PostRequest ended by the io_context's
// destruction never calls `done`.
//
// Thread safety: StartPost may be called from the io_context's thread only (or before it runs).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "daemon/webhooks.h"

namespace ft {

struct PostRequest {
  WebhookUrl url;
  std::map<std::string, std::string>
      headers;  // besides Host, Content-Type (JSON), Content-Length, User-Agent
  std::string body;
  std::chrono::milliseconds timeout{10'000};
};

using PostDone = std::function<void(int status, const std::string& error)>;

// `tls` outlives the request (used for https:// only).
void StartPost(boost::asio::io_context& io, boost::asio::ssl::context& tls, PostRequest request,
               PostDone done);

}  // namespace ft
