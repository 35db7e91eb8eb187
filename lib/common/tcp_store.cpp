#include "common/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace ncclwatch {
namespace store {

namespace {

int64_t NowMs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
}

int Remaining(int64_t deadline_ms) {
  const int64_t left = deadline_ms - NowMs();
  return left <= 0 ? 0 : left > 1 << 30 ? 1 << 30 : static_cast<int>(left);
}

void PutU8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }

// Little-endian whatever the host (the servers are x86-64 and aarch64: little-endian).
void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PutString(std::string* out, const std::string& s) {
  PutLe(out, s.size(), 8);
  out->append(s);
}

// A key as PyTorch's own client sends it: after its "/" (so that `store.get("a")` in Python and
// our "a" are the same key).
void PutKey(std::string* out, const std::string& key) {
  PutLe(out, key.size() + 1, 8);
  out->push_back('/');
  out->append(key);
}

}  // namespace

void EncodeValidate(std::string* out) {
  PutU8(out, static_cast<uint8_t>(Query::Validate));
  PutLe(out, kValidationMagic, 4);
}

void EncodeSet(std::string* out, const std::string& key, const std::string& value) {
  PutU8(out, static_cast<uint8_t>(Query::Set));
  PutKey(out, key);
  PutString(out, value);
}

void EncodeGet(std::string* out, const std::string& key) {
  PutU8(out, static_cast<uint8_t>(Query::Get));
  PutKey(out, key);
}

void EncodeAdd(std::string* out, const std::string& key, int64_t delta) {
  PutU8(out, static_cast<uint8_t>(Query::Add));
  PutKey(out, key);
  PutLe(out, static_cast<uint64_t>(delta), 8);
}

void EncodeCheck(std::string* out, const std::string& key) {
  PutU8(out, static_cast<uint8_t>(Query::Check));
  PutLe(out, 1, 8);
  PutKey(out, key);
}

void EncodeWait(std::string* out, const std::string& key) {
  PutU8(out, static_cast<uint8_t>(Query::Wait));
  PutLe(out, 1, 8);
  PutKey(out, key);
}

void EncodeDelete(std::string* out, const std::string& key) {
  PutU8(out, static_cast<uint8_t>(Query::DeleteKey));
  PutKey(out, key);
}

void EncodeCancelWait(std::string* out) { PutU8(out, static_cast<uint8_t>(Query::CancelWait)); }

void EncodeGetNumKeys(std::string* out) { PutU8(out, static_cast<uint8_t>(Query::GetNumKeys)); }

bool ParseAddress(const std::string& text, std::string* host, int* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= text.size()) return false;
  std::string h = text.substr(0, colon);
  if (h.front() == '[') {
    if (h.size() < 3 || h.back() != ']') return false;
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string::npos) {
    return false;  // a bare IPv6 address: its port is ambiguous
  }
  char* end = nullptr;
  long p = strtol(text.c_str() + colon + 1, &end, 10);
  if (*end || p <= 0 || p > 65535) return false;
  *host = h;
  *port = static_cast<int>(p);
  return true;
}

bool Client::Fail(const char* what) {
  error_ = what;
  Close();
  return false;
}

void Client::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void Client::Adopt(int fd) {
  Close();
  fd_ = fd;
  if (fd_ >= 0) fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
  error_.clear();
}

bool Client::Connect(const std::string& host, int port, int timeout_ms, std::string* why) {
  Close();
  const int64_t deadline = NowMs() + timeout_ms;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  // A numeric address first: no name service, no wait.
  hints.ai_flags |= AI_NUMERICHOST;
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    hints.ai_flags &= ~AI_NUMERICHOST;
    rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  }
  if (rc != 0 || !list) {
    *why = std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
    error_ = *why;
    return false;
  }
  std::string last = "no address";
  for (addrinfo* a = list; a && fd_ < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = strerror(errno);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    // A vanished server is noticed on an idle connection too (a WAIT may sit for long).
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    int idle = 30, interval = 10, count = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last = strerror(errno);
      close(fd);
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    int n;
    do n = poll(&p, 1, Remaining(deadline));
    while (n < 0 && errno == EINTR);
    int err = 0;
    socklen_t len = sizeof err;
    if (n <= 0) {
      last = n == 0 ? "connection timed out" : strerror(errno);
    } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      last = strerror(err ? err : errno);
    } else {
      fd_ = fd;
      break;
    }
    close(fd);
  }
  freeaddrinfo(list);
  if (fd_ < 0) {
    *why = last;
    error_ = last;
    return false;
  }
  // The validation, then one CHECK: a TCPStore answers it with one byte (0 or 1); anything
  // else (nothing, a closed connection, another byte) is not one.
  out_.clear();
  EncodeValidate(&out_);
  EncodeCheck(&out_, "ncclwatch/hello");
  uint8_t answer = 0xff;
  ++requests_;
  if (!SendAll(out_, deadline) || !ReceiveU8(&answer, deadline) || answer > kCheckNotReady) {
    *why = answer != 0xff && answer > kCheckNotReady ? std::string("not a TCPStore (an unexpected answer)")
                                                     : "not a TCPStore, or not answering (" + error_ + ")";
    Close();
    error_ = *why;
    return false;
  }
  error_.clear();
  return true;
}

bool Client::SendAll(const std::string& bytes, int64_t deadline_ms) {
  if (fd_ < 0) return Fail("not connected");
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      bytes_sent_ += static_cast<uint64_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      int r = poll(&p, 1, Remaining(deadline_ms));
      if (r == 0) return Fail("the store did not take the request in time");
      if (r < 0 && errno != EINTR) return Fail(strerror(errno));
      continue;
    }
    return Fail(n < 0 ? strerror(errno) : "connection closed");
  }
  return true;
}

bool Client::ReceiveAll(void* out, size_t n, int64_t deadline_ms) {
  if (fd_ < 0) return Fail("not connected");
  char* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    ssize_t r = recv(fd_, p + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      bytes_received_ += static_cast<uint64_t>(r);
      continue;
    }
    if (r == 0) return Fail("the store closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Fail(strerror(errno));
    pollfd pf{fd_, POLLIN, 0};
    int k = poll(&pf, 1, Remaining(deadline_ms));
    if (k == 0) return Fail("the store did not answer in time");
    if (k < 0 && errno != EINTR) return Fail(strerror(errno));
  }
  return true;
}

bool Client::ReceiveI64(int64_t* v, int64_t deadline_ms) {
  unsigned char b[8];
  if (!ReceiveAll(b, 8, deadline_ms)) return false;
  uint64_t u = 0;
  for (int i = 7; i >= 0; --i) u = (u << 8) | b[i];
  *v = static_cast<int64_t>(u);
  return true;
}

bool Client::ReceiveValue(std::string* v, int64_t deadline_ms) {
  int64_t len = 0;
  if (!ReceiveI64(&len, deadline_ms)) return false;
  if (len < 0 || static_cast<uint64_t>(len) > kMaxValue) return Fail("an answer longer than any value");
  v->resize(static_cast<size_t>(len));
  return len == 0 || ReceiveAll(&(*v)[0], static_cast<size_t>(len), deadline_ms);
}

bool Client::Set(const std::string& key, const std::string& value, int timeout_ms) {
  if (key.size() + 1 > kMaxKey || value.size() > kMaxValue) {
    error_ = "key or value over the store's bounds";
    return false;  // refused here: the connection stays
  }
  out_.clear();
  EncodeSet(&out_, key, value);
  ++requests_;
  return SendAll(out_, NowMs() + timeout_ms);
}

bool Client::Check(const std::string& key, bool* exists, int timeout_ms) {
  const int64_t deadline = NowMs() + timeout_ms;
  out_.clear();
  EncodeCheck(&out_, key);
  ++requests_;
  uint8_t a = 0xff;
  if (!SendAll(out_, deadline) || !ReceiveU8(&a, deadline)) return false;
  if (a > kCheckNotReady) return Fail("an unexpected answer to CHECK");
  *exists = a == kCheckReady;
  return true;
}

bool Client::Get(const std::string& key, std::string* value, bool* found, int timeout_ms) {
  const int64_t deadline = NowMs() + timeout_ms;
  value->clear();
  // GET of a missing key is answered "" by one server and never by the other (it waits):
  // CHECK first.
  bool exists = false;
  if (!Check(key, &exists, Remaining(deadline))) return false;
  *found = exists;
  if (!exists) return true;
  out_.clear();
  EncodeGet(&out_, key);
  ++requests_;
  return SendAll(out_, deadline) && ReceiveValue(value, deadline);
}

bool Client::Add(const std::string& key, int64_t delta, int64_t* result, int timeout_ms) {
  const int64_t deadline = NowMs() + timeout_ms;
  out_.clear();
  EncodeAdd(&out_, key, delta);
  ++requests_;
  return SendAll(out_, deadline) && ReceiveI64(result, deadline);
}

bool Client::Delete(const std::string& key, int timeout_ms, int64_t* deleted) {
  const int64_t deadline = NowMs() + timeout_ms;
  out_.clear();
  EncodeDelete(&out_, key);
  ++requests_;
  int64_t n = 0;
  if (!SendAll(out_, deadline) || !ReceiveI64(&n, deadline)) return false;
  if (deleted) *deleted = n;
  return true;
}

bool Client::NumKeys(int64_t* n, int timeout_ms) {
  const int64_t deadline = NowMs() + timeout_ms;
  out_.clear();
  EncodeGetNumKeys(&out_);
  ++requests_;
  return SendAll(out_, deadline) && ReceiveI64(n, deadline);
}

bool Client::CancelWait(bool* ready, int64_t deadline_ms) {
  out_.clear();
  EncodeCancelWait(&out_);
  ++requests_;
  if (!SendAll(out_, deadline_ms)) return false;
  uint8_t a = 0xff;
  if (!ReceiveU8(&a, deadline_ms)) return false;
  if (a == kStopWaiting) {  // the key came as we gave up: the cancellation's own answer follows
    *ready = true;
    if (!ReceiveU8(&a, deadline_ms)) return false;
  }
  if (a != kWaitCanceled) return Fail("an unexpected answer to CANCEL_WAIT");
  return true;
}

Client::WaitResult Client::Wait(const std::string& key, int timeout_ms, int wake_fd) {
  // The cancellation's answer is expected soon after: a server that keeps it longer is slow.
  constexpr int kCancelMs = 2000;
  const int64_t deadline = NowMs() + timeout_ms;
  out_.clear();
  EncodeWait(&out_, key);
  ++requests_;
  if (!SendAll(out_, deadline + kCancelMs)) return WaitResult::Failed;
  bool woken = false;
  for (;;) {
    pollfd p[2] = {{fd_, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    int n = poll(p, wake_fd >= 0 ? 2 : 1, Remaining(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Fail(strerror(errno)), WaitResult::Failed;
    if (n > 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      uint8_t a = 0xff;
      if (!ReceiveU8(&a, NowMs() + kCancelMs)) return WaitResult::Failed;
      if (a != kStopWaiting) return Fail("an unexpected answer to WAIT"), WaitResult::Failed;
      return WaitResult::Ready;
    }
    woken = n > 0 && wake_fd >= 0 && (p[1].revents & POLLIN);
    if (n == 0 || woken) break;
  }
  bool ready = false;
  if (!CancelWait(&ready, NowMs() + kCancelMs)) return WaitResult::Failed;
  return ready ? WaitResult::Ready : woken ? WaitResult::Woken : WaitResult::TimedOut;
}

}  // namespace store
}  // namespace ncclwatch
