#include "worker/http_get.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace ft::worker {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct Url {
  std::string host;
  std::string port = "80";
  std::string target = "/";
};

StatusOr<Url> ParseUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    return Status::InvalidArgument("'" + url + "': only http:// URLs are supported");
  Url u;
  const std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  if (slash != std::string::npos) u.target = rest.substr(slash);
  const size_t colon = authority.rfind(':');
  if (colon != std::string::npos && authority.find(']', colon) == std::string::npos) {
    u.port = authority.substr(colon + 1);
    authority.resize(colon);
  }
  if (authority.size() > 2 && authority.front() == '[' && authority.back() == ']') {
    authority = authority.substr(1, authority.size() - 2);
  }
  if (authority.empty() || u.port.empty()) return Status::InvalidArgument("'" + url + "': no host");
  u.host = authority;
  return u;
}

// The exchange as a chain of asynchronous steps on one io_context, so one
// deadline covers all of them.
class Exchange {
 public:
  Exchange(asio::io_context& io, const Url& url, const HttpRequest& r)
      : resolver_(io), stream_(io), url_(url), timeout_(r.timeout) {
    request_.method(r.method == "PUT" ? http::verb::put : http::verb::get);
    request_.target(url.target);
    request_.version(11);
    request_.set(http::field::host, url.host);
    request_.set(http::field::user_agent, "ft-worker");
    for (const auto& [name, value] : r.headers) request_.set(name, value);
    request_.prepare_payload();
  }

  void Start() {
    stage_ = "resolve";
    resolver_.async_resolve(url_.host, url_.port,
                            [this](beast::error_code ec, tcp::resolver::results_type rs) {
                              if (ec) return Done(ec);
                              stage_ = "connect";
                              stream_.expires_after(timeout_);
                              stream_.async_connect(rs, [this](beast::error_code ec2, const tcp::endpoint&) {
                                if (ec2) return Done(ec2);
                                stage_ = "write";
                                http::async_write(stream_, request_, [this](beast::error_code ec3, size_t) {
                                  if (ec3) return Done(ec3);
                                  stage_ = "read";
                                  http::async_read(stream_, buffer_, response_,
                                                   [this](beast::error_code ec4, size_t) { Done(ec4); });
                                });
                              });
                            });
  }

  // Cancels whatever is pending (the deadline passed during resolution).
  void Cancel() {
    resolver_.cancel();
    stream_.cancel();
  }

  bool finished() const { return finished_; }
  StatusOr<HttpResponse> Result() const {
    if (!finished_ || error_) {
      const std::string why = finished_ ? error_.message() : "timed out";
      return Status::Unavailable(url_.host + ":" + url_.port + ": " + stage_ + ": " + why);
    }
    return HttpResponse{static_cast<int>(response_.result_int()), response_.body()};
  }

 private:
  void Done(beast::error_code ec) {
    finished_ = true;
    error_ = ec;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  }

  tcp::resolver resolver_;
  beast::tcp_stream stream_;
  Url url_;
  std::chrono::milliseconds timeout_;
  http::request<http::string_body> request_;
  beast::flat_buffer buffer_;
  http::response<http::string_body> response_;
  std::string stage_;
  bool finished_ = false;
  beast::error_code error_;
};

}  // namespace

StatusOr<HttpResponse> HttpFetch(const HttpRequest& request) {
  FT_ASSIGN_OR_RETURN(Url url, ParseUrl(request.url));
  asio::io_context io;
  Exchange exchange(io, url, request);
  exchange.Start();
  io.run_for(request.timeout + std::chrono::milliseconds(50));
  if (!exchange.finished()) {
    exchange.Cancel();
    io.restart();
    io.run();  // let the cancelled handlers finish
    if (!exchange.finished()) return Status::Unavailable(url.host + ": timed out");
    return Status::Unavailable(url.host + ":" + url.port + ": timed out after " +
                               std::to_string(request.timeout.count()) + " ms");
  }
  return exchange.Result();
}

}  // namespace ft::worker
