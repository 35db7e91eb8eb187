#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "dump/dump_files.h"
#include "dump/request_relay.h"
#include "temp_dir.h"

using namespace ncclwatch;
using testing::TempDir;

namespace {

// One rank: its view of the shared dump directory and its relay.
struct Rank {
  Rank(const std::string& shared, const std::string& relay_dir, const std::string& host)
      : dumps(shared, shared, 5), relay(relay_dir, host) {}
  std::optional<trace::DumpRequest> Poll() { return relay.Poll(&dumps, "", 0); }
  DumpDirectory dumps;
  RequestRelay relay;
};

}  // namespace

TEST_CASE("relay: one watcher per host reads the shared directory, the others read the relay") {
  TempDir shared_tmp, relay_tmp;
  std::string shared = shared_tmp.path(), relay_dir = relay_tmp.path();
  Rank a(shared, relay_dir, "hostA"), b(shared, relay_dir, "hostA"), c(shared, relay_dir, "hostA");
  Rank other_host(shared, relay_dir, "hostB");
  for (Rank* r : {&a, &b, &c, &other_host}) CHECK_FALSE(r->Poll().has_value());
  CHECK(a.relay.watcher());
  CHECK_FALSE(b.relay.watcher());
  CHECK_FALSE(c.relay.watcher());
  CHECK(other_host.relay.watcher());  // another host: its own relay, its own watcher
  CHECK(a.relay.relay_path() != other_host.relay.relay_path());

  DumpDirectory writer(shared, shared, 5);
  REQUIRE(writer.WriteRequest({"h-1-0", 3, "hostB", "stall", "", 0}));
  for (int tick = 0; tick < 5; ++tick) {
    auto got = a.Poll();  // the watcher polls first here: it relays, then the others see it
    CHECK(got.has_value() == (tick == 0));
    for (Rank* r : {&b, &c}) {
      auto relayed = r->Poll();
      REQUIRE(relayed.has_value() == (tick == 0));
      if (relayed) CHECK(relayed->request == "h-1-0");
    }
  }
  CHECK(a.relay.shared_checks() == 6);
  CHECK(b.relay.shared_checks() == 0);  // never touched the shared directory
  CHECK(c.relay.shared_checks() == 0);
  struct stat st {};
  REQUIRE(stat(a.relay.relay_path().c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK(st.st_uid == getuid());
}

TEST_CASE("relay: when the watcher leaves, another rank of the host takes over") {
  TempDir shared_tmp, relay_tmp;
  std::string shared = shared_tmp.path(), relay_dir = relay_tmp.path();
  auto a = std::make_unique<Rank>(shared, relay_dir, "h");
  Rank b(shared, relay_dir, "h");
  a->Poll();
  b.Poll();
  REQUIRE(a->relay.watcher());
  REQUIRE_FALSE(b.relay.watcher());
  a.reset();  // exits or dies: the kernel releases its lock
  b.Poll();
  CHECK(b.relay.watcher());
  DumpDirectory writer(shared, shared, 5);
  REQUIRE(writer.WriteRequest({"h-2-0", 1, "h", "stall", "", 0}));
  auto got = b.Poll();
  REQUIRE(got.has_value());
  CHECK(got->request == "h-2-0");
}

TEST_CASE("relay: an unusable relay directory costs one line and each rank reads the shared directory") {
  TempDir shared_tmp;
  std::string shared = shared_tmp.path();
  Rank a(shared, "/proc/ncclwatch-no-such-dir", "h"), b(shared, "/proc/ncclwatch-no-such-dir", "h");
  Rank off(shared, "none", "h");
  DumpDirectory writer(shared, shared, 5);
  REQUIRE(writer.WriteRequest({"h-3-0", 1, "h", "stall", "", 0}));
  for (Rank* r : {&a, &b, &off}) {
    auto got = r->Poll();
    REQUIRE(got.has_value());
    CHECK(got->request == "h-3-0");
    CHECK_FALSE(r->relay.watcher());
    CHECK(r->relay.shared_checks() == 1);
  }
}

TEST_CASE("relay: another user's file under the relay's name is never used") {
  if (getuid() != 0) return;  // needs to create a file owned by someone else
  TempDir shared_tmp, relay_tmp;
  std::string shared = shared_tmp.path(), relay_dir = relay_tmp.path();
  DumpDirectory probe(shared, shared, 5);
  char cwd[4096];
  REQUIRE(getcwd(cwd, sizeof cwd));
  std::string lock = relay_dir + "/" + RelayFileName(probe.RequestPath(), "h") + ".lock";
  { FILE* f = fopen(lock.c_str(), "w"); REQUIRE(f); fclose(f); }
  REQUIRE(chown(lock.c_str(), 12345, 12345) == 0);
  Rank a(shared, relay_dir, "h");
  DumpDirectory writer(shared, shared, 5);
  REQUIRE(writer.WriteRequest({"h-4-0", 1, "h", "stall", "", 0}));
  auto got = a.Poll();
  REQUIRE(got.has_value());  // read from the shared directory instead
  CHECK_FALSE(a.relay.watcher());
  CHECK(a.relay.shared_checks() == 1);
}

TEST_CASE("relay: the watcher leaves nothing behind in the node-local directory at a normal exit") {
  TempDir shared_tmp, relay_tmp;
  std::string shared = shared_tmp.path(), relay_dir = relay_tmp.path();
  Rank a(shared, relay_dir, "h");
  DumpDirectory writer(shared, shared, 5);
  REQUIRE(writer.WriteRequest({"h-5-0", 1, "h", "stall", "", 0}));
  REQUIRE(a.Poll().has_value());
  std::string path = a.relay.relay_path();
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  a.relay.Leave();
  CHECK(stat(path.c_str(), &st) != 0);
  CHECK(stat((path + ".lock").c_str(), &st) != 0);
}
