#include "common/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <list>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/logging.h"
#include "common/status.h"

namespace ulysses {
namespace metrics {
namespace {

// A request's line and headers; Prometheus and kubelet send a few hundred bytes.
constexpr size_t kMaxRequestBytes = 16 * 1024;
constexpr char kPlain[] = "text/plain; charset=utf-8";

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

absl::Status CheckRange(absl::string_view field, int value, int lo, int hi, absl::string_view fix) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("metrics.", field, " = ", value, " is out of range; use ", lo, "..", hi, fix));
}

std::string StatusLine(int code) {
  switch (code) {
    case 200:
      return "200 OK";
    case 400:
      return "400 Bad Request";
    case 404:
      return "404 Not Found";
    case 405:
      return "405 Method Not Allowed";
    case 413:
      return "413 Payload Too Large";
    case 431:
      return "431 Request Header Fields Too Large";
    case 503:
      return "503 Service Unavailable";
    default:
      return absl::StrCat(code, " Error");
  }
}

std::string Answer(int code, absl::string_view content_type, absl::string_view body, bool head,
                   absl::string_view extra_headers = "") {
  std::string out = absl::StrCat("HTTP/1.1 ", StatusLine(code), "\r\nContent-Type: ", content_type,
                                 "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                                 "Connection: close\r\n\r\n");
  if (!head) absl::StrAppend(&out, body);
  return out;
}

// The peer's address without the port ("10.1.2.3", "::1"): connections are counted by it.
std::string PeerOf(const sockaddr_storage& addr) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text, sizeof(text));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, text,
              sizeof(text));
  }
  return text;
}

}  // namespace

absl::Status ValidateMetricsServerConfig(const MetricsServerConfig& config) {
  if (config.host.empty()) {
    return absl::InvalidArgumentError(
        "metrics.host is empty; set an address such as 127.0.0.1 or the pod IP");
  }
  RETURN_IF_ERROR(CheckRange("port", config.port, 0, 65535, ", or 0 for any free port"));
  RETURN_IF_ERROR(CheckRange("max_connections", config.max_connections, 1, 4096, ""));
  RETURN_IF_ERROR(CheckRange("max_connections_per_peer", config.max_connections_per_peer, 1,
                             config.max_connections, " (at most max_connections)"));
  RETURN_IF_ERROR(CheckRange("read_deadline_ms", config.read_deadline_ms, 10, 60000, ""));
  RETURN_IF_ERROR(CheckRange("write_deadline_ms", config.write_deadline_ms, 10, 600000, ""));
  return absl::OkStatus();
}

class MetricsServer::Impl {
 public:
  Impl(const Registry* registry, MetricsServerConfig config, HealthCheck readiness_check,
       HealthCheck liveness_check, Exposition exposition)
      : registry_(registry),
        config_(std::move(config)),
        readiness_check_(std::move(readiness_check)),
        liveness_check_(std::move(liveness_check)),
        exposition_(std::move(exposition)) {}

  ~Impl() { Stop(); }

  absl::Status Start() {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kNew) {
      return absl::FailedPreconditionError("metrics server: Start() called twice");
    }
    RETURN_IF_ERROR(ValidateMetricsServerConfig(config_));
    int bound = 0;
    if (absl::Status status = Listen(&bound); !status.ok()) {
      CloseFds();
      return status;
    }
    port_.store(bound);
    state_ = State::kRunning;
    thread_ = std::thread([this] { Loop(); });
    ULOG(INFO) << "metrics server listening on " << config_.host << ":" << bound;
    return absl::OkStatus();
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kRunning) {
      stopping_.store(true);
      const char byte = 1;
      (void)!write(wake_[1], &byte, 1);
      thread_.join();
    }
    CloseFds();
    state_ = State::kStopped;
  }

  int port() const { return port_.load(); }
  std::string address() const { return absl::StrCat(config_.host, ":", port_.load()); }

 private:
  enum class State { kNew, kRunning, kStopped };

  // One accepted connection; touched only by the loop thread.
  struct Conn {
    int fd = -1;
    std::string peer;
    int64_t deadline_ms = 0;  // Read deadline until the answer is ready, then the write one.
    std::string in;           // The request received so far.
    std::string out;          // The answer; empty while reading.
    size_t sent = 0;
  };

  absl::Status Listen(int* bound) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string where = absl::StrCat(config_.host, ":", config_.port);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(config_.port);
    if (int rc = getaddrinfo(config_.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
      return absl::InvalidArgumentError(absl::StrCat("metrics server: cannot resolve host \"",
                                                     config_.host, "\": ", gai_strerror(rc),
                                                     "; use an address of this host"));
    }
    std::string error = "no address";
    for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      // SO_REUSEADDR (not SO_REUSEPORT): a second server on a busy port is an error.
      int yes = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
        listen_fd_ = fd;
      } else {
        error = std::strerror(errno);
        close(fd);
      }
    }
    freeaddrinfo(found);
    if (listen_fd_ < 0) {
      return absl::UnavailableError(absl::StrCat(
          "metrics server: cannot listen on ", where, " (", error,
          "); free the port, or choose another metrics port or an address of this host"));
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&local), &len);
    *bound = ntohs(local.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&local)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&local)->sin_port);
    if (pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) {
      return absl::UnavailableError(absl::StrCat("metrics server: pipe: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }

  void CloseFds() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int* fd : {&listen_fd_, &wake_[0], &wake_[1]}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
  }

  // The event loop: accepts, reads requests, answers them and enforces the deadlines until
  // Stop(); then closes every connection.
  void Loop() {
    std::list<Conn> conns;
    std::map<std::string, int> per_peer;
    std::vector<pollfd> fds;
    std::vector<std::list<Conn>::iterator> polled;
    while (!stopping_.load()) {
      fds.clear();
      polled.clear();
      fds.push_back({wake_[0], POLLIN, 0});
      const bool room = static_cast<int>(conns.size()) < config_.max_connections;
      fds.push_back({listen_fd_, static_cast<short>(room ? POLLIN : 0), 0});
      int64_t next_deadline = NowMs() + 60000;
      for (auto it = conns.begin(); it != conns.end(); ++it) {
        fds.push_back({it->fd, static_cast<short>(it->out.empty() ? POLLIN : POLLOUT), 0});
        polled.push_back(it);
        next_deadline = std::min(next_deadline, it->deadline_ms);
      }
      const int timeout = static_cast<int>(std::clamp<int64_t>(next_deadline - NowMs(), 0, 60000));
      if (poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) {
        ULOG(ERROR) << "metrics server: poll: " << std::strerror(errno);
        break;
      }
      if (fds[1].revents & POLLIN) Accept(&conns, &per_peer);
      const int64_t now = NowMs();
      for (size_t i = 0; i < polled.size(); ++i) {
        auto it = polled[i];
        const short events = fds[i + 2].revents;
        bool done = false;
        if (events & POLLIN) {
          done = Read(&*it, now);
        } else if (events & POLLOUT) {
          done = Write(&*it);
        } else if (events & (POLLERR | POLLHUP | POLLNVAL)) {
          done = true;
        }
        if (!done && now >= it->deadline_ms) done = true;  // Missed its deadline: cut.
        if (done) {
          close(it->fd);
          if (--per_peer[it->peer] == 0) per_peer.erase(it->peer);
          conns.erase(it);
        }
      }
    }
    for (Conn& c : conns) close(c.fd);
  }

  void Accept(std::list<Conn>* conns, std::map<std::string, int>* per_peer) {
    while (static_cast<int>(conns->size()) < config_.max_connections) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN: none left (or a transient error: poll again).
      std::string peer = PeerOf(addr);
      int& open = (*per_peer)[peer];
      if (open >= config_.max_connections_per_peer) {
        close(fd);  // This peer already holds its share; the others keep theirs.
        continue;
      }
      ++open;
      Conn c;
      c.fd = fd;
      c.peer = std::move(peer);
      c.deadline_ms = NowMs() + config_.read_deadline_ms;
      conns->push_back(std::move(c));
    }
  }

  // Reads what the peer sent; once the headers are complete the answer is made. True when
  // the connection is finished (peer closed, error).
  bool Read(Conn* c, int64_t now) {
    char buf[4096];
    ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    c->in.append(buf, static_cast<size_t>(n));
    size_t end = c->in.find("\r\n\r\n");
    if (end == std::string::npos ? c->in.size() > kMaxRequestBytes : end > kMaxRequestBytes) {
      c->out = Answer(431, kPlain, "request headers exceed 16 KiB\n", false);
    } else if (end == std::string::npos) {
      return false;
    } else {
      c->out = Respond(absl::string_view(c->in).substr(0, end));
    }
    c->in.clear();
    c->deadline_ms = now + config_.write_deadline_ms;
    shutdown(c->fd, SHUT_RD);
    return Write(c);
  }

  // Sends what the socket takes. True when the answer is out (or the peer is gone).
  bool Write(Conn* c) {
    while (c->sent < c->out.size()) {
      ssize_t n = send(c->fd, c->out.data() + c->sent, c->out.size() - c->sent, MSG_NOSIGNAL);
      if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
      c->sent += static_cast<size_t>(n);
    }
    return true;
  }

  // The answer to one request (its line and headers, without the blank line).
  std::string Respond(absl::string_view request) {
    std::vector<absl::string_view> lines = absl::StrSplit(request, "\r\n");
    std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
    if (parts.size() != 3 || !absl::StartsWith(parts[2], "HTTP/1.")) {
      return Answer(400, kPlain, "malformed request line\n", false);
    }
    const bool head = parts[0] == "HEAD";
    if (parts[0] != "GET" && !head) {
      return Answer(405, kPlain, "only GET and HEAD are served\n", false, "Allow: GET, HEAD\r\n");
    }
    for (size_t i = 1; i < lines.size(); ++i) {
      std::pair<absl::string_view, absl::string_view> kv =
          absl::StrSplit(lines[i], absl::MaxSplits(':', 1));
      std::string name = absl::AsciiStrToLower(kv.first);
      absl::string_view value = absl::StripAsciiWhitespace(kv.second);
      int64_t length = 0;
      if (name == "transfer-encoding" ||
          (name == "content-length" && (!absl::SimpleAtoi(value, &length) || length != 0))) {
        return Answer(413, kPlain, "requests here carry no body\n", head);
      }
    }
    absl::string_view path = parts[1].substr(0, parts[1].find('?'));
    if (path == "/metrics") {
      return Answer(200, kTextContentType, exposition_ ? exposition_() : registry_->Serialize(),
                    head);
    }
    if (path == "/readyz" || path == "/healthz") return Probe(readiness_check_, head);
    if (path == "/livez") return Probe(liveness_check_, head);
    return Answer(404, kPlain, "not found: try /metrics, /readyz, /healthz or /livez\n", head);
  }

  static std::string Probe(const HealthCheck& check, bool head) {
    absl::Status status = check ? check() : absl::OkStatus();
    if (status.ok()) return Answer(200, kPlain, "ok\n", head);
    return Answer(503, kPlain, absl::StrCat(status.ToString(), "\n"), head);
  }

  const Registry* const registry_;
  const MetricsServerConfig config_;
  const HealthCheck readiness_check_;
  const HealthCheck liveness_check_;
  const Exposition exposition_;
  absl::Mutex mu_;  // Serialises Start/Stop.
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  // Written by Start() before the loop thread starts and closed by Stop() after it ends;
  // the loop reads them in between.
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> port_{0};
};

MetricsServer::MetricsServer(const Registry* registry, MetricsServerConfig config,
                             HealthCheck readiness_check, HealthCheck liveness_check,
                             Exposition exposition)
    : impl_(std::make_unique<Impl>(registry, std::move(config), std::move(readiness_check),
                                   std::move(liveness_check), std::move(exposition))) {}

MetricsServer::~MetricsServer() = default;

absl::Status MetricsServer::Start() { return impl_->Start(); }
void MetricsServer::Stop() { impl_->Stop(); }
int MetricsServer::port() const { return impl_->port(); }
std::string MetricsServer::address() const { return impl_->address(); }

}  // namespace metrics
}  // namespace ulysses
