// The TCPStore client's bytes, pinned (lib/common/tcp_store.h), and its handling of answers,
// over a socketpair whose other end plays the server's part byte by byte. The real server is
// tested in tests/e2e/cases_store.py (PyTorch's own TCPStore, when torch is installed).
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <chrono>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "common/tcp_store.h"
#include "dump/store_evidence.h"

using namespace ncclwatch;
using namespace ncclwatch::store;

namespace {

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

std::string Le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// The server's end: reads what the client sent, writes canned answers.
struct Pair {
  Pair() {
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    client.Adopt(sv[0]);
    server = sv[1];
  }
  ~Pair() { close(server); }
  std::string Read(size_t n) {
    std::string s(n, '\0');
    size_t done = 0;
    while (done < n) {
      ssize_t r = read(server, &s[done], n - done);
      if (r <= 0) break;
      done += static_cast<size_t>(r);
    }
    s.resize(done);
    return s;
  }
  void Write(const std::string& s) { REQUIRE(write(server, s.data(), s.size()) == static_cast<ssize_t>(s.size())); }
  Client client;
  int server = -1;
};

}  // namespace

TEST_CASE("store: each request's bytes") {
  std::string out;
  EncodeValidate(&out);
  CHECK(out == Bytes({0x00, 0xCE, 0xF7, 0x85, 0x3C}));
  out.clear();
  EncodeSet(&out, "k", "vv");
  CHECK(out == Bytes({0x01}) + Le64(2) + "/k" + Le64(2) + "vv");
  out.clear();
  EncodeGet(&out, "key");
  CHECK(out == Bytes({0x03}) + Le64(4) + "/key");
  out.clear();
  EncodeAdd(&out, "n", -2);
  CHECK(out == Bytes({0x04}) + Le64(2) + "/n" + Bytes({0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}));
  out.clear();
  EncodeCheck(&out, "ab");
  CHECK(out == Bytes({0x05}) + Le64(1) + Le64(3) + "/ab");
  out.clear();
  EncodeWait(&out, "ab");
  CHECK(out == Bytes({0x06}) + Le64(1) + Le64(3) + "/ab");
  out.clear();
  EncodeDelete(&out, "ab");
  CHECK(out == Bytes({0x08}) + Le64(3) + "/ab");
  out.clear();
  EncodeCancelWait(&out);
  EncodeGetNumKeys(&out);
  CHECK(out == Bytes({0x0C, 0x07}));
  out.clear();
  EncodeSet(&out, "", "");
  CHECK(out == Bytes({0x01}) + Le64(1) + "/" + Le64(0));
}

TEST_CASE("store: addresses") {
  std::string host;
  int port = 0;
  CHECK(ParseAddress("node0:29500", &host, &port));
  CHECK((host == "node0" && port == 29500));
  CHECK(ParseAddress("[::1]:7", &host, &port));
  CHECK((host == "::1" && port == 7));
  for (const char* bad : {"node0", ":1", "node0:", "node0:0", "node0:70000", "node0:12x", "::1:5", "[]:5"})
    CHECK_FALSE(ParseAddress(bad, &host, &port));
}

TEST_CASE("store: GET asks CHECK first and a missing key sends no GET") {
  Pair p;
  std::thread server([&] {
    CHECK(p.Read(1 + 8 + 8 + 4) == Bytes({0x05}) + Le64(1) + Le64(4) + "/key");
    p.Write(Bytes({kCheckNotReady}));
    CHECK(p.Read(1 + 8 + 8 + 4) == Bytes({0x05}) + Le64(1) + Le64(4) + "/key");
    p.Write(Bytes({kCheckReady}));
    CHECK(p.Read(1 + 8 + 4) == Bytes({0x03}) + Le64(4) + "/key");
    p.Write(Le64(5) + "hello");
  });
  std::string v = "x";
  bool found = true;
  REQUIRE(p.client.Get("key", &v, &found, 2000));
  CHECK_FALSE(found);
  CHECK(v.empty());
  REQUIRE(p.client.Get("key", &v, &found, 2000));
  CHECK(found);
  CHECK(v == "hello");
  server.join();
}

TEST_CASE("store: ADD and DELETE_KEY read an 8-byte answer") {
  Pair p;
  std::thread server([&] {
    CHECK(p.Read(1 + 8 + 2 + 8) == Bytes({0x04}) + Le64(2) + "/n" + Le64(1));
    p.Write(Le64(41));
    CHECK(p.Read(1 + 8 + 2) == Bytes({0x08}) + Le64(2) + "/n");
    p.Write(Le64(1));
  });
  int64_t r = 0, deleted = 0;
  REQUIRE(p.client.Add("n", 1, &r, 2000));
  CHECK(r == 41);
  REQUIRE(p.client.Delete("n", 2000, &deleted));
  CHECK(deleted == 1);
  server.join();
  CHECK(p.client.connected());
}

TEST_CASE("store: a WAIT past its time is cancelled, and a STOP_WAITING that crossed it is read") {
  Pair p;
  std::thread server([&] {
    CHECK(p.Read(1 + 8 + 8 + 2) == Bytes({0x06}) + Le64(1) + Le64(2) + "/r");
    CHECK(p.Read(1) == Bytes({0x0C}));
    p.Write(Bytes({kWaitCanceled}));
    CHECK(p.Read(1 + 8 + 8 + 2) == Bytes({0x06}) + Le64(1) + Le64(2) + "/r");
    CHECK(p.Read(1) == Bytes({0x0C}));
    p.Write(Bytes({kStopWaiting, kWaitCanceled}));  // the key came as the client gave up
    CHECK(p.Read(1 + 8 + 8 + 2) == Bytes({0x06}) + Le64(1) + Le64(2) + "/r");
    p.Write(Bytes({kStopWaiting}));
  });
  CHECK(p.client.Wait("r", 50) == Client::WaitResult::TimedOut);
  CHECK(p.client.Wait("r", 50) == Client::WaitResult::Ready);
  CHECK(p.client.Wait("r", 5000) == Client::WaitResult::Ready);
  server.join();
  CHECK(p.client.connected());
}

TEST_CASE("store: a WAIT is woken by the caller's descriptor") {
  Pair p;
  int wake[2];
  REQUIRE(pipe(wake) == 0);
  std::thread server([&] {
    CHECK(p.Read(1 + 8 + 8 + 2).size() == 19);
    CHECK(write(wake[1], "x", 1) == 1);
    CHECK(p.Read(1) == Bytes({0x0C}));
    p.Write(Bytes({kWaitCanceled}));
  });
  CHECK(p.client.Wait("r", 10000, wake[0]) == Client::WaitResult::Woken);
  server.join();
  close(wake[0]);
  close(wake[1]);
}

TEST_CASE("store: a silent or vanished server fails within the deadline and closes the connection") {
  {
    Pair p;
    int64_t r = 0;
    auto t0 = std::chrono::steady_clock::now();
    CHECK_FALSE(p.client.Add("n", 1, &r, 100));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    CHECK_FALSE(p.client.connected());
    CHECK(p.client.error().find("in time") != std::string::npos);
  }
  {
    Pair p;
    close(p.server);
    p.server = -1;
    int64_t r = 0;
    CHECK_FALSE(p.client.Add("n", 1, &r, 1000));
    CHECK_FALSE(p.client.connected());
    CHECK(p.client.Wait("r", 1000) == Client::WaitResult::Failed);
  }
  {
    Pair p;
    std::thread server([&] {
      p.Read(19);
      p.Write(Bytes({0x07}));  // not an answer WAIT has
    });
    CHECK(p.client.Wait("r", 2000) == Client::WaitResult::Failed);
    server.join();
    CHECK_FALSE(p.client.connected());
  }
}

TEST_CASE("store: nothing listening, or a server that is not a TCPStore: Connect fails in time") {
  Client c;
  std::string why;
  // A port nobody listens on (bound, not listening).
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  CHECK_FALSE(c.Connect("127.0.0.1", port, 1000, &why));
  CHECK_FALSE(why.empty());
  // Listening, never answering.
  REQUIRE(listen(s, 4) == 0);
  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(c.Connect("127.0.0.1", port, 300, &why));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  CHECK(why.find("not a TCPStore") != std::string::npos);
  CHECK_FALSE(c.connected());
  close(s);
  CHECK_FALSE(c.Connect("no-such-host.invalid", 1, 1000, &why));
}

TEST_CASE("store: a published dump reads back and anything else is refused") {
  std::string text(50000, 'x');
  for (size_t i = 0; i < text.size(); i += 7) text[i] = static_cast<char>('a' + i % 26);
  std::string value, back, why;
  REQUIRE(EncodeDump(text, &value));
  CHECK(value.size() < text.size());  // compressed (libz.so.1 is there wherever the tests run)
  CHECK(value.compare(0, 5, "NWZ1 ") == 0);
  REQUIRE(DecodeDump(value, &back, &why));
  CHECK(back == text);
  CHECK(DecodeDump("NWR1 3\nabc", &back, &why));
  CHECK(back == "abc");
  CHECK_FALSE(DecodeDump("NWR1 4\nabc", &back, &why));
  CHECK_FALSE(DecodeDump("{\"a\":1}", &back, &why));
  CHECK_FALSE(DecodeDump("NWZ1 10\nnot zlib", &back, &why));
  CHECK_FALSE(DecodeDump("NWZ1 99999999999\n", &back, &why));
  CHECK(JobPrefix("job7", "2") == "ncclwatch/job7/2/");
  CHECK(JobPrefix("", "") == "ncclwatch/none/0/");
}
