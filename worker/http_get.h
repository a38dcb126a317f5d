// A minimal HTTP/1.1 client for cloud metadata endpoints (Boost.Beast):
// one request per connection, plain http only, and a deadline on the whole
// exchange (name resolution included).
//
// Thread safety: a pure function; each call has its own connection.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ft::worker {

struct HttpRequest {
  std::string method = "GET";  // GET | PUT
  std::string url;             // "http://host[:port]/path"
  std::vector<std::pair<std::string, std::string>> headers;
  std::chrono::milliseconds timeout{1000};
};

struct HttpResponse {
  int status = 0;  // e.g. 200, 404
  std::string body;
};

// Any HTTP status is a response. InvalidArgument for a URL this client cannot
// use; Unavailable when the server cannot be resolved, reached or read from
// in time (the message says which).
StatusOr<HttpResponse> HttpFetch(const HttpRequest& request);

}  // namespace ft::worker
