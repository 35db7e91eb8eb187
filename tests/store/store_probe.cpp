// Drives lib/common/tcp_store.h's client against a real server, one step per argument, one line
// of output per step (tests/store/test_torch_store.py checks them against PyTorch's own client):
//   store_probe HOST:PORT STEP...   set:KEY:VALUE get:KEY add:KEY:N check:KEY wait:KEY:MS del:KEY numkeys
//   sleep:MS
// Exit 0 when every step ran (a step's failure is printed as "fail <why>" and the connection is
// made again for the next step), 2 when the connection could not be made at first.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/tcp_store.h"

using namespace ncclwatch::store;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: store_probe HOST:PORT STEP...\n");
    return 1;
  }
  std::string host, why;
  int port = 0;
  if (!ParseAddress(argv[1], &host, &port)) {
    std::fprintf(stderr, "bad address %s\n", argv[1]);
    return 1;
  }
  Client c;
  if (!c.Connect(host, port, 3000, &why)) {
    std::printf("connect fail %s\n", why.c_str());
    return 2;
  }
  std::printf("connect ok\n");
  for (int i = 2; i < argc; ++i) {
    std::string step = argv[i];
    if (!c.connected() && !c.Connect(host, port, 3000, &why)) {
      std::printf("connect fail %s\n", why.c_str());
      continue;
    }
    auto field = [&](int n) {
      size_t at = 0;
      for (int k = 0; k < n; ++k) at = step.find(':', at) + 1;
      size_t end = n == 2 && step.rfind("set:", 0) == 0 ? std::string::npos : step.find(':', at);
      return step.substr(at, end == std::string::npos ? std::string::npos : end - at);
    };
    const std::string op = step.substr(0, step.find(':'));
    bool ok = true;
    if (op == "set") {
      ok = c.Set(field(1), field(2), 3000);
      if (ok) std::printf("set ok\n");
    } else if (op == "get") {
      std::string v;
      bool found = false;
      ok = c.Get(field(1), &v, &found, 3000);
      if (ok) std::printf(found ? "get %s\n" : "get missing\n", v.c_str());
    } else if (op == "add") {
      int64_t r = 0;
      ok = c.Add(field(1), atoll(field(2).c_str()), &r, 3000);
      if (ok) std::printf("add %lld\n", static_cast<long long>(r));
    } else if (op == "check") {
      bool e = false;
      ok = c.Check(field(1), &e, 3000);
      if (ok) std::printf("check %d\n", e ? 1 : 0);
    } else if (op == "wait") {
      switch (c.Wait(field(1), atoi(field(2).c_str()))) {
        case Client::WaitResult::Ready: std::printf("wait ready\n"); break;
        case Client::WaitResult::TimedOut: std::printf("wait timeout\n"); break;
        case Client::WaitResult::Woken: std::printf("wait woken\n"); break;
        case Client::WaitResult::Failed: ok = false; break;
      }
    } else if (op == "del") {
      int64_t n = 0;
      ok = c.Delete(field(1), 3000, &n);
      if (ok) std::printf("del %lld\n", static_cast<long long>(n));
    } else if (op == "numkeys") {
      int64_t n = 0;
      ok = c.NumKeys(&n, 3000);
      if (ok) std::printf("numkeys %lld\n", static_cast<long long>(n));
    } else if (op == "sleep") {
      usleep(static_cast<useconds_t>(atoi(field(1).c_str())) * 1000);
      std::printf("slept\n");
    } else {
      std::printf("unknown step %s\n", step.c_str());
    }
    if (!ok) std::printf("fail %s\n", c.error().c_str());
    std::fflush(stdout);
  }
  std::printf("requests %llu\n", static_cast<unsigned long long>(c.requests()));
  return 0;
}
