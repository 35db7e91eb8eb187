// A client of the launcher's key-value store: PyTorch 2.x's TCPStore (the one torchrun's agent
// serves at MASTER_ADDR:MASTER_PORT, and that `torch.distributed.TCPStore` serves or joins).
//
// Written from the protocol as PyTorch documents and tests it, not from its code. A request is
// one query-type byte and its arguments; integers are 8-byte little-endian (the lengths and the
// counters, int64 for ADD and DELETE_KEY), strings and values are an 8-byte length and their bytes:
//   VALIDATE(0)  u32 magic 0x3C85F7CE, no answer (a connection's first message; any other first
//                message is ignored by the server)
//   SET(1)       key, value; no answer
//   GET(3)       key -> value (the libuv server answers "" for a missing key: asked after CHECK)
//   ADD(4)       key, i64 -> i64 (the value is kept as decimal text)
//   CHECK(5)     u64 n, n keys -> u8 READY(0) | NOT_READY(1)
//   WAIT(6)      u64 n, n keys -> u8 STOP_WAITING(0) once every key exists (at once if they do)
//   GETNUMKEYS(7) -> i64
//   DELETE_KEY(8) key -> i64 (how many were deleted)
//   CANCEL_WAIT(12) -> u8 WAIT_CANCELED(1) (a STOP_WAITING that crossed it may come first)
//   PING(13)     u32 nonce -> the same u32
// A key goes on the wire after a "/", as PyTorch's own client sends every key (its
// `store.get("a")` asks for "/a"): what we write, PyTorch's Python API reads under the same name.
// Keys are at most 8 KiB, values at most 8 MiB (the libuv server's bounds; kMaxKey, kMaxValue).
// Supported: PyTorch 2.0 and later, both server back ends (libuv, the default since 2.4, and the
// older one): only queries that 2.0 already had are used (PING is not: see Connect).
//
// Never in the application's way: the socket is our own (non-blocking, close-on-exec, connected
// with a deadline), every call is bounded by its deadline, a failed or late call closes the
// connection (its state is unknown) and the caller decides what follows. The server serves each
// connection's queries in order and independently of the others: a WAIT held on this
// connection blocks nobody else's use of the store. Not thread-safe: one owner thread.
#pragma once

#include <cstdint>
#include <string>

namespace ncclwatch {
namespace store {

enum class Query : uint8_t {
  Validate = 0,
  Set = 1,
  CompareSet = 2,
  Get = 3,
  Add = 4,
  Check = 5,
  Wait = 6,
  GetNumKeys = 7,
  DeleteKey = 8,
  Append = 9,
  MultiGet = 10,
  MultiSet = 11,
  CancelWait = 12,
  Ping = 13,
};
constexpr uint32_t kValidationMagic = 0x3C85F7CE;
constexpr uint8_t kCheckReady = 0, kCheckNotReady = 1;
constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;
constexpr size_t kMaxKey = 8 * 1024;
constexpr size_t kMaxValue = 8 * 1024 * 1024;

// The bytes of one request, appended to `out` (the unit tests pin them); `key` without its "/".
void EncodeValidate(std::string* out);
void EncodeSet(std::string* out, const std::string& key, const std::string& value);
void EncodeGet(std::string* out, const std::string& key);
void EncodeAdd(std::string* out, const std::string& key, int64_t delta);
void EncodeCheck(std::string* out, const std::string& key);
void EncodeWait(std::string* out, const std::string& key);
void EncodeDelete(std::string* out, const std::string& key);
void EncodeCancelWait(std::string* out);
void EncodeGetNumKeys(std::string* out);

// "HOST:PORT", "[V6]:PORT"; false when it is not one.
bool ParseAddress(const std::string& text, std::string* host, int* port);

class Client {
 public:
  enum class WaitResult { Ready, TimedOut, Woken, Failed };

  Client() = default;
  ~Client() { Close(); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Connects within `timeout_ms` (name resolution included; a numeric address resolves at once),
  // sends the validation and proves the server a TCPStore with one CHECK. False: *why says
  // what failed, in a few words.
  bool Connect(const std::string& host, int port, int timeout_ms, std::string* why);
  // Takes a connected socket (tests: one end of a socketpair); sends nothing.
  void Adopt(int fd);
  void Close();
  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // What the last failure was ("" none).
  const std::string& error() const { return error_; }

  // Each: within `timeout_ms`; false (and the connection closed) on any failure.
  bool Set(const std::string& key, const std::string& value, int timeout_ms);
  // *found false (and *value "") when the key does not exist.
  bool Get(const std::string& key, std::string* value, bool* found, int timeout_ms);
  bool Add(const std::string& key, int64_t delta, int64_t* result, int timeout_ms);
  bool Check(const std::string& key, bool* exists, int timeout_ms);
  bool Delete(const std::string& key, int timeout_ms, int64_t* deleted = nullptr);
  bool NumKeys(int64_t* n, int timeout_ms);
  // Waits for `key` to exist, up to `timeout_ms`, or until `wake_fd` (-1: none) is readable.
  // Past the time, or woken, the wait is cancelled on the server (CANCEL_WAIT) before this
  // returns, so the connection is ready for the next query. Failed: the connection is closed.
  WaitResult Wait(const std::string& key, int timeout_ms, int wake_fd = -1);

  // Counters, for the documented load figures.
  uint64_t requests() const { return requests_; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

 private:
  bool Fail(const char* what);
  bool SendAll(const std::string& bytes, int64_t deadline_ms);
  bool ReceiveAll(void* out, size_t n, int64_t deadline_ms);
  bool ReceiveU8(uint8_t* v, int64_t deadline_ms) { return ReceiveAll(v, 1, deadline_ms); }
  bool ReceiveI64(int64_t* v, int64_t deadline_ms);
  bool ReceiveValue(std::string* v, int64_t deadline_ms);
  // Ends a WAIT this side gave up on: CANCEL_WAIT, then its answer (after the STOP_WAITING that
  // may have crossed it). *ready: the key came after all.
  bool CancelWait(bool* ready, int64_t deadline_ms);

  int fd_ = -1;
  std::string out_;  // reused request buffer
  std::string error_;
  uint64_t requests_ = 0, bytes_sent_ = 0, bytes_received_ = 0;
};

}  // namespace store
}  // namespace ncclwatch
