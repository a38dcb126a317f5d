#include "daemon/http_post.h"

#include <openssl/ssl.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/host_name_verification.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <memory>

namespace ft {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// One request's connection, from resolving the host to the answer (see http_post.h).
class Post : public std::enable_shared_from_this<Post> {
 public:
  Post(asio::io_context& io, asio::ssl::context& tls, PostRequest request, PostDone done)
      : request_(std::move(request)),
        done_(std::move(done)),
        resolver_(io),
        stream_(io, tls),
        deadline_(io) {}

  void Start() {
    BuildRequest();
    deadline_.expires_after(request_.timeout);
    deadline_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->TimedOut();
    });
    resolver_.async_resolve(request_.url.host, request_.url.port,
                            [self = shared_from_this()](beast::error_code ec, tcp::resolver::results_type r) {
                              if (ec) return self->Fail("cannot resolve " + self->request_.url.host, ec);
                              self->Connect(r);
                            });
  }

 private:
  void BuildRequest() {
    req_.method(http::verb::post);
    req_.target(request_.url.target);
    req_.version(11);
    const std::string& port = request_.url.port;
    const bool default_port = port == (request_.url.https ? "443" : "80");
    const std::string host =
        request_.url.host.find(':') != std::string::npos ? "[" + request_.url.host + "]" : request_.url.host;
    req_.set(http::field::host, default_port ? host : host + ":" + port);
    req_.set(http::field::user_agent, "ftune-webhook/1");
    req_.set(http::field::content_type, "application/json");
    req_.set(http::field::connection, "close");
    for (const auto& [name, value] : request_.headers) req_.set(name, value);
    req_.body() = request_.body;
    req_.prepare_payload();
  }

  void Connect(const tcp::resolver::results_type& results) {
    beast::get_lowest_layer(stream_).async_connect(results, [self = shared_from_this()](
                                                                beast::error_code ec, const tcp::endpoint&) {
      if (ec)
        return self->Fail("cannot connect to " + self->request_.url.host + ":" + self->request_.url.port, ec);
      if (!self->request_.url.https) return self->Write();
      self->Handshake();
    });
  }

  void Handshake() {
    const std::string& host = request_.url.host;
    if (!SSL_set_tlsext_host_name(stream_.native_handle(), host.c_str())) {
      return Fail("cannot set the TLS server name", beast::error_code());
    }
    stream_.set_verify_mode(asio::ssl::verify_peer);
    stream_.set_verify_callback(asio::ssl::host_name_verification(host));
    stream_.async_handshake(
        asio::ssl::stream_base::client, [self = shared_from_this()](beast::error_code ec) {
          if (ec) return self->Fail("TLS handshake with " + self->request_.url.host + " failed", ec);
          self->Write();
        });
  }

  void Write() {
    auto next = [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->Fail("cannot send the request", ec);
      self->Read();
    };
    if (request_.url.https) {
      http::async_write(stream_, req_, std::move(next));
    } else {
      http::async_write(stream_.next_layer(), req_, std::move(next));
    }
  }

  void Read() {
    auto next = [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->Fail("no answer", ec);
      self->Finish(static_cast<int>(self->res_.result_int()), "");
    };
    if (request_.url.https) {
      http::async_read(stream_, buffer_, res_, std::move(next));
    } else {
      http::async_read(stream_.next_layer(), buffer_, res_, std::move(next));
    }
  }

  void TimedOut() {
    if (finished_) return;
    timed_out_ = true;
    resolver_.cancel();
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().close(ignored);
  }

  void Fail(const std::string& what, const beast::error_code& ec) {
    if (timed_out_) {
      return Finish(0, "timed out after " + std::to_string(request_.timeout.count()) + " ms (" + what + ")");
    }
    Finish(0, what + (ec ? ": " + ec.message() : ""));
  }

  void Finish(int status, const std::string& error) {
    if (finished_) return;
    finished_ = true;
    deadline_.cancel();
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().close(ignored);
    done_(status, error);
  }

  PostRequest request_;
  PostDone done_;
  tcp::resolver resolver_;
  beast::ssl_stream<beast::tcp_stream> stream_;
  asio::steady_timer deadline_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
  beast::flat_buffer buffer_;
  bool finished_ = false;
  bool timed_out_ = false;
};

}  // namespace

void StartPost(asio::io_context& io, asio::ssl::context& tls, PostRequest request, PostDone done) {
  std::make_shared<Post>(io, tls, std::move(request), std::move(done))->Start();
}

}  // namespace ft
