// In-process tests of the simulated NCCL: reductions, fault syntax, exports, and every
// collective / p2p / hang / abort behaviour on single-process cliques (ncclCommInitAll or one
// thread per rank). The multi-process behaviour is tested through simlaunch (tests/sim/CMakeLists.txt, check_run.sh).
#include <catch2/catch.hpp>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "fault.h"
#include "ncclwatch/cuda_abi.h"
#include "ncclwatch/nccl_abi.h"
#include "reduce.h"

using namespace simnccl;
using namespace std::chrono_literals;

namespace {

// N ranks in this process: one communicator, stream and device buffer pair per rank.
struct Clique {
  int n;
  std::vector<ncclComm_t> comms;
  std::vector<CUstream> streams;

  explicit Clique(int ranks, const char* chunk_bytes = nullptr) : n(ranks), comms(ranks), streams(ranks) {
    REQUIRE(cuInit(0) == CUDA_SUCCESS);
    if (chunk_bytes) setenv("NCCLWATCH_SIM_CHUNK_BYTES", chunk_bytes, 1);
    REQUIRE(ncclCommInitAll(comms.data(), n, nullptr) == ncclSuccess);
    unsetenv("NCCLWATCH_SIM_CHUNK_BYTES");
    for (auto& s : streams) REQUIRE(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
  }
  ~Clique() {
    for (auto c : comms) ncclCommAbort(c);  // releases anything a test left blocked
    for (auto s : streams) cuStreamSynchronize(s);
    for (auto s : streams) cuStreamDestroy(s);
  }
  void SyncAll() {
    for (auto s : streams) REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  }
  bool AllDone() {
    for (auto s : streams)
      if (cuStreamQuery(s) != CUDA_SUCCESS) return false;
    return true;
  }
};

template <class F>
void Group(F f) {
  REQUIRE(ncclGroupStart() == ncclSuccess);
  f();
  REQUIRE(ncclGroupEnd() == ncclSuccess);
}

// Per-rank host buffers stand in for device memory (the simulator's device memory is host memory).
using Buf = std::vector<float>;

}  // namespace

TEST_CASE("every function of the ABI lists is exported") {
#define CHECK_OP(name, ...) CHECK(dlsym(RTLD_DEFAULT, #name) != nullptr);
#define CHECK_FN(ret, name, ...) CHECK(dlsym(RTLD_DEFAULT, #name) != nullptr);
  NCCLWATCH_FOR_EACH_OPERATION(CHECK_OP)
  NCCLWATCH_FOR_EACH_MANAGED(CHECK_FN)
  NCCLWATCH_FOR_EACH_PASSTHROUGH(CHECK_FN)
#undef CHECK_OP
#undef CHECK_FN
}

TEST_CASE("ncclGetVersion: 22800, or NCCLWATCH_SIM_NCCL_VERSION") {
  int v = 0;
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  CHECK(v == 22800);
  setenv("NCCLWATCH_SIM_NCCL_VERSION", "22809", 1);
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  unsetenv("NCCLWATCH_SIM_NCCL_VERSION");
  CHECK(v == 22809);
  CHECK(std::string(ncclGetErrorString(ncclInProgress)).find("progress") != std::string::npos);
}

TEST_CASE("reductions over every datatype and operation") {
  SECTION("int8 sums wrap, max/min/prod/avg") {
    int8_t a[3] = {100, -128, 7}, b[3] = {100, -1, -3}, out[3];
    const void* src[2] = {a, b};
    Reduce(ncclInt8, ncclSum, 0, out, src, 2, 3);
    CHECK(out[0] == -56);
    CHECK(out[1] == 127);
    CHECK(out[2] == 4);
    Reduce(ncclInt8, ncclMax, 0, out, src, 2, 3);
    CHECK((out[0] == 100 && out[1] == -1 && out[2] == 7));
    Reduce(ncclInt8, ncclMin, 0, out, src, 2, 3);
    CHECK((out[1] == -128 && out[2] == -3));
    Reduce(ncclInt8, ncclProd, 0, out, src, 2, 3);
    CHECK(out[2] == -21);
    Reduce(ncclInt8, ncclAvg, 0, out, src, 2, 3);
    CHECK(out[2] == 2);
  }
  SECTION("uint64, float64, premulsum") {
    uint64_t a[1] = {~0ull}, b[1] = {2}, o[1];
    const void* s[2] = {a, b};
    Reduce(ncclUint64, ncclSum, 0, o, s, 2, 1);
    CHECK(o[0] == 1);
    double x[2] = {1.5, -2}, y[2] = {2.5, 8}, d[2];
    const void* t[2] = {x, y};
    Reduce(ncclFloat64, ncclAvg, 0, d, t, 2, 2);
    CHECK((d[0] == 2.0 && d[1] == 3.0));
    Reduce(ncclFloat64, kRedOpPreMulSum, 0.5, d, t, 2, 2);
    CHECK((d[0] == 2.0 && d[1] == 3.0));
  }
  SECTION("float16 / bfloat16 / float8 through float, rounded to nearest even") {
    uint16_t h1[1] = {0x3c00 /*1.0*/}, h2[1] = {0x4000 /*2.0*/}, ho[1];
    const void* hs[2] = {h1, h2};
    Reduce(ncclFloat16, ncclSum, 0, ho, hs, 2, 1);
    CHECK(ho[0] == 0x4200);  // 3.0
    uint16_t b1[1] = {0x3f80 /*1.0*/}, bo[1];
    const void* bs[2] = {b1, b1};
    Reduce(ncclBfloat16, ncclSum, 0, bo, bs, 2, 1);
    CHECK(bo[0] == 0x4000);  // 2.0
    CHECK(MiniEncode(1.0 + 1.0 / 2048, 5, 10, true) == 0x3c00);  // tie to even
    CHECK(MiniEncode(1e6, 5, 10, true) == 0x7c00);               // float16 overflows to inf
    CHECK(MiniEncode(1000, 4, 3, false) == 0x7e);                // e4m3 saturates at 448
    for (unsigned bits = 0; bits < 0x10000; ++bits) {
      double v = MiniDecode(bits, 5, 10, true);
      if (!std::isnan(v)) REQUIRE(MiniEncode(v, 5, 10, true) == bits);
      v = MiniDecode(bits, 8, 7, true);
      if (!std::isnan(v)) REQUIRE(MiniEncode(v, 8, 7, true) == bits);
    }
  }
  CHECK(DtypeSize(ncclFloat16) == 2);
  CHECK(DtypeSize(ncclFloat8e5m2) == 1);
  CHECK(DtypeSize(ncclNumTypes) == 0);
}

TEST_CASE("NCCLWATCH_SIM_FAULT syntax") {
  std::vector<Fault> f;
  std::string err;
  REQUIRE(ParseFaults("stall:rank=3,seq=42;delay:rank=0,seq=1,comm=1,ms=250; crash:rank=2,seq=5,signal=SEGV",
                      &f, &err));
  REQUIRE(f.size() == 3);
  CHECK((f[0].kind == FaultKind::kStall && f[0].rank == 3 && f[0].seq == 42 && f[0].comm == -1));
  CHECK((f[1].kind == FaultKind::kDelay && f[1].comm == 1 && f[1].ms == 250));
  CHECK((f[2].kind == FaultKind::kCrash && f[2].signal == 11));
  REQUIRE(ParseFaults("kernel:rank=1,seq=2,ms=-1;", &f, &err));
  CHECK(f[0].ms == -1);
  for (const char* bad : {"stal:rank=1,seq=1", "stall:rank=1", "stall:rank=x,seq=1", "stall:rank=1,seq=0",
                          "crash:rank=1,seq=1,signal=TERM", "stall:rank=1,seq=1,ms=5", "abort",
                          "error:rank=1,seq=1,foo=2"}) {
    INFO(bad);
    CHECK_FALSE(ParseFaults(bad, &f, &err));
    CHECK_FALSE(err.empty());
    CHECK(f.empty());
  }
}

TEST_CASE("collectives move and reduce the data", "[clique]") {
  const char* chunk = GENERATE(as<const char*>{}, nullptr, "256");  // 256: many chunks per op
  Clique q(4, chunk);
  const int n = q.n;
  const size_t count = 1000;
  std::vector<Buf> send(n), recv(n);
  auto fill = [&](size_t scount, size_t rcount) {
    for (int r = 0; r < n; ++r) {
      send[r].assign(scount, 0);
      for (size_t i = 0; i < scount; ++i) send[r][i] = float(r * 100000 + i);
      recv[r].assign(rcount, -1);
    }
  };
  SECTION("AllReduce sum / max") {
    fill(count, count);
    Group([&] {
      for (int r = 0; r < n; ++r)
        REQUIRE(ncclAllReduce(send[r].data(), recv[r].data(), count, ncclFloat, ncclSum, q.comms[r], q.streams[r]) == 0);
    });
    q.SyncAll();
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) REQUIRE(recv[r][i] == float(600000 + 4 * i));
    Group([&] {
      for (int r = 0; r < n; ++r)
        REQUIRE(ncclAllReduce(send[r].data(), recv[r].data(), count, ncclFloat, ncclMax, q.comms[r], q.streams[r]) == 0);
    });
    q.SyncAll();
    for (int r = 0; r < n; ++r) REQUIRE(recv[r][7] == float(300007));
  }
  SECTION("Broadcast and in-place Bcast from root 2") {
    fill(count, count);
    Group([&] {
      for (int r = 0; r < n; ++r)
        REQUIRE(ncclBroadcast(send[r].data(), recv[r].data(), count, ncclFloat, 2, q.comms[r], q.streams[r]) == 0);
    });
    q.SyncAll();
    for (int r = 0; r < n; ++r) REQUIRE(recv[r] == send[2]);
    Group([&] {
      for (int r = 0; r < n; ++r) REQUIRE(ncclBcast(send[r].data(), count, ncclFloat, 1, q.comms[r], q.streams[r]) == 0);
    });
    q.SyncAll();
    for (int r = 0; r < n; ++r) REQUIRE(send[r] == send[1]);
  }
  SECTION("Reduce to root 3: only the root's buffer changes") {
    fill(count, count);
    Group([&] {
      for (int r = 0; r < n; ++r)
        REQUIRE(ncclReduce(send[r].data(), recv[r].data(), count, ncclFloat, ncclSum, 3, q.comms[r], q.streams[r]) == 0);
    });
    q.SyncAll();
    CHECK(recv[3][10] == float(600040));
    CHECK(recv[0][10] == -1);
  }
  SECTION("AllGather and Gather") {
    fill(count, count * n);
    Group([&] {
      for (int r = 0; r < n; ++r)
        REQUIRE(ncclAllGather(send[r].data(), recv[r].data(), count, ncclFloat, q.comms[r], q.streams[r]) == 0);
    });
    q.SyncAll();
    for (int r = 0; r < n; ++r)
      for (int s = 0; s < n; ++s) REQUIRE(recv[r][s * count + 5] == float(s * 100000 + 5));
    fill(count, count * n);
    Group([&] {
      for (int r = 0; r < n; ++r)
        REQUIRE(ncclGather(send[r].data(), recv[r].data(), count, ncclFloat, 1, q.comms[r], q.streams[r]) == 0);
    });
    q.SyncAll();
    CHECK(recv[1][3 * count + 9] == float(300009));
    CHECK(recv[0][3 * count + 9] == -1);
  }
  SECTION("ReduceScatter, AlltoAll, Scatter") {
    fill(count * n, count);
    Group([&] {
      for (int r = 0; r < n; ++r)
        REQUIRE(ncclReduceScatter(send[r].data(), recv[r].data(), count, ncclFloat, ncclSum, q.comms[r], q.streams[r]) == 0);
    });
    q.SyncAll();
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; i += 97) REQUIRE(recv[r][i] == float(600000 + 4 * (r * count + i)));
    fill(count * n, count * n);
    Group([&] {
      for (int r = 0; r < n; ++r)
        REQUIRE(ncclAlltoAll(send[r].data(), recv[r].data(), count, ncclFloat, q.comms[r], q.streams[r]) == 0);
    });
    q.SyncAll();
    for (int r = 0; r < n; ++r)
      for (int s = 0; s < n; ++s) REQUIRE(recv[r][s * count + 11] == send[s][r * count + 11]);
    fill(count * n, count);
    Group([&] {
      for (int r = 0; r < n; ++r)
        REQUIRE(ncclScatter(send[r].data(), recv[r].data(), count, ncclFloat, 0, q.comms[r], q.streams[r]) == 0);
    });
    q.SyncAll();
    for (int r = 0; r < n; ++r) REQUIRE(recv[r][count - 1] == send[0][r * count + count - 1]);
  }
}

TEST_CASE("point to point", "[clique]") {
  Clique q(3, "128");
  const size_t count = 500;  // 2000 bytes through 128-byte pipes
  std::vector<Buf> send(3, Buf(count)), recv(3, Buf(count, -1));
  for (int r = 0; r < 3; ++r)
    for (size_t i = 0; i < count; ++i) send[r][i] = float(r * 1000 + i);
  SECTION("a ring of Send/Recv in a group completes") {
    Group([&] {
      for (int r = 0; r < 3; ++r) {
        REQUIRE(ncclSend(send[r].data(), count, ncclFloat, (r + 1) % 3, q.comms[r], q.streams[r]) == 0);
        REQUIRE(ncclRecv(recv[r].data(), count, ncclFloat, (r + 2) % 3, q.comms[r], q.streams[r]) == 0);
      }
    });
    q.SyncAll();
    for (int r = 0; r < 3; ++r) REQUIRE(recv[r] == send[(r + 2) % 3]);
  }
  SECTION("a Send outside a group waits for its Recv (rendezvous), even a small one") {
    REQUIRE(ncclSend(send[0].data(), 1, ncclFloat, 1, q.comms[0], q.streams[0]) == 0);
    std::this_thread::sleep_for(300ms);
    CHECK(cuStreamQuery(q.streams[0]) == CUDA_ERROR_NOT_READY);
    REQUIRE(ncclRecv(recv[1].data(), 1, ncclFloat, 0, q.comms[1], q.streams[1]) == 0);
    q.SyncAll();
    CHECK(recv[1][0] == send[0][0]);
  }
  SECTION("two ranks that both send first deadlock; abort releases them") {
    REQUIRE(ncclSend(send[0].data(), count, ncclFloat, 1, q.comms[0], q.streams[0]) == 0);
    REQUIRE(ncclRecv(recv[0].data(), count, ncclFloat, 1, q.comms[0], q.streams[0]) == 0);
    REQUIRE(ncclSend(send[1].data(), count, ncclFloat, 0, q.comms[1], q.streams[1]) == 0);
    REQUIRE(ncclRecv(recv[1].data(), count, ncclFloat, 0, q.comms[1], q.streams[1]) == 0);
    std::this_thread::sleep_for(300ms);
    CHECK(cuStreamQuery(q.streams[0]) == CUDA_ERROR_NOT_READY);
    CHECK(cuStreamQuery(q.streams[1]) == CUDA_ERROR_NOT_READY);
    REQUIRE(ncclCommAbort(q.comms[0]) == ncclSuccess);
    REQUIRE(ncclCommAbort(q.comms[1]) == ncclSuccess);
    REQUIRE(cuStreamSynchronize(q.streams[0]) == CUDA_SUCCESS);
    REQUIRE(cuStreamSynchronize(q.streams[1]) == CUDA_SUCCESS);
    CHECK(ncclSend(send[0].data(), 1, ncclFloat, 1, q.comms[0], q.streams[0]) == ncclInvalidUsage);
  }
}

TEST_CASE("a mismatch hangs (no error) until ncclCommAbort", "[clique]") {
  Clique q(4);
  std::vector<Buf> buf(4, Buf(16, 1));
  const auto what = GENERATE(0, 1, 2);  // count, datatype, root
  Group([&] {
    for (int r = 0; r < 4; ++r) {
      bool odd = r == 3;
      if (what == 0)
        REQUIRE(ncclAllReduce(buf[r].data(), buf[r].data(), odd ? 9 : 8, ncclFloat, ncclSum, q.comms[r], q.streams[r]) == 0);
      else if (what == 1)
        REQUIRE(ncclAllReduce(buf[r].data(), buf[r].data(), 8, odd ? ncclInt32 : ncclFloat, ncclSum, q.comms[r], q.streams[r]) == 0);
      else
        REQUIRE(ncclBroadcast(buf[r].data(), buf[r].data(), 8, ncclFloat, odd ? 1 : 0, q.comms[r], q.streams[r]) == 0);
    }
  });
  std::this_thread::sleep_for(300ms);
  CHECK_FALSE(q.AllDone());
  for (int r = 0; r < 4; ++r) {
    ncclResult_t e = ncclInternalError;
    REQUIRE(ncclCommGetAsyncError(q.comms[r], &e) == ncclSuccess);
    CHECK(e == ncclSuccess);
  }
  auto t0 = std::chrono::steady_clock::now();
  for (auto c : q.comms) ncclCommAbort(c);
  q.SyncAll();
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
}

TEST_CASE("one rank per thread: init, split, non-blocking, graph capture") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  const int n = 4;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<std::string> failures(n);
  auto run = [&](auto body) {
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { failures[r] = body(r); });
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      CHECK(failures[r] == "");
    }
  };
  SECTION("split by parity; NOCOLOR gives NULL") {
    run([&](int r) -> std::string {
      ncclComm_t world, half;
      CUstream s;
      if (ncclCommInitRank(&world, n, id, r) != ncclSuccess) return "init";
      cuStreamCreate(&s, 0);
      int color = r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2;
      if (ncclCommSplit(world, color, -r, &half, nullptr) != ncclSuccess) return "split";
      if (r == 3) return half == nullptr ? "" : "NOCOLOR gave a communicator";
      int hr = -1, hn = -1;
      ncclCommUserRank(half, &hr);
      ncclCommCount(half, &hn);
      // key = -rank reverses the order: ranks {0, 2} -> 2 is rank 0; rank 1 is alone.
      int want_n = r % 2 == 0 ? 2 : 1, want_r = r == 0 ? 1 : 0;
      if (hn != want_n || hr != want_r) return "rank/size " + std::to_string(hr) + "/" + std::to_string(hn);
      int v = r + 1, out = 0;
      ncclAllReduce(&v, &out, 1, ncclInt32, ncclSum, half, s);
      cuStreamSynchronize(s);
      int want = r % 2 == 0 ? 1 + 3 : 2;
      ncclCommDestroy(half);
      ncclCommDestroy(world);
      return out == want ? "" : "sum " + std::to_string(out);
    });
  }
  SECTION("shrink: the survivors get a smaller communicator; finalize flushes") {
    run([&](int r) -> std::string {
      ncclComm_t world, small = nullptr;
      CUstream s;
      if (ncclCommInitRankScalable(&world, n, r, 1, &id, nullptr) != ncclSuccess) return "init";
      if (r == 1) return "";  // excluded (as if dead): never calls shrink
      cuStreamCreate(&s, 0);
      int excluded[] = {1};
      if (ncclCommShrink(world, excluded, 1, &small, nullptr, NCCL_SHRINK_DEFAULT) != ncclSuccess) return "shrink";
      int sr = -1, sn = -1;
      ncclCommUserRank(small, &sr);
      ncclCommCount(small, &sn);
      if (sn != 3 || sr != (r == 0 ? 0 : r - 1)) return "rank/size " + std::to_string(sr) + "/" + std::to_string(sn);
      int v = r, out = 0;
      ncclAllReduce(&v, &out, 1, ncclInt32, ncclSum, small, s);
      if (ncclCommFinalize(small) != ncclSuccess) return "finalize";
      // Finalize flushed the operation: its result is there without a stream sync.
      int flushed = out;
      cuStreamSynchronize(s);
      ncclCommDestroy(small);
      return flushed == 0 + 2 + 3 ? "" : "sum after finalize " + std::to_string(flushed);
    });
  }
  SECTION("non-blocking init and collectives report ncclInProgress, then complete") {
    run([&](int r) -> std::string {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.blocking = 0;
      ncclComm_t c;
      CUstream s;
      cuStreamCreate(&s, 0);
      if (ncclCommInitRankConfig(&c, n, id, r, &cfg) != ncclInProgress) return "init did not return InProgress";
      ncclResult_t e;
      do {
        ncclCommGetAsyncError(c, &e);
      } while (e == ncclInProgress);
      if (e != ncclSuccess) return "init failed";
      // A non-blocking split; its child is used before the split is known to be done.
      ncclComm_t child = nullptr;
      int one = 1, total = 0;
      if (ncclCommSplit(c, 0, r, &child, &cfg) != ncclInProgress) return "split did not return InProgress";
      ncclResult_t cr = ncclAllReduce(&one, &total, 1, ncclInt32, ncclSum, child, s);
      if (cr != ncclInProgress && cr != ncclSuccess) return "op on a splitting child failed";
      do {
        ncclCommGetAsyncError(child, &e);
      } while (e == ncclInProgress);
      cuStreamSynchronize(s);
      if (total != n) return "child sum " + std::to_string(total);
      float v = float(r), out = -1;
      if (ncclAllReduce(&v, &out, 1, ncclFloat, ncclSum, c, s) != ncclInProgress) return "op did not return InProgress";
      ncclCommGetAsyncError(c, &e);
      if (e != ncclInProgress) return "GetAsyncError not InProgress right after the call";
      do {
        ncclCommGetAsyncError(c, &e);
        std::this_thread::yield();
      } while (e == ncclInProgress);
      cuStreamSynchronize(s);
      ncclCommDestroy(c);
      return out == 6.0f ? "" : "sum " + std::to_string(out);
    });
  }
  SECTION("an all-reduce captured into a graph runs at every replay, not at capture") {
    run([&](int r) -> std::string {
      ncclComm_t c;
      CUstream s;
      if (ncclCommInitRank(&c, n, id, r) != ncclSuccess) return "init";
      cuStreamCreate(&s, 0);
      int v = r + 1, out = 0;
      CUgraph g;
      CUgraphExec ge;
      cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
      if (ncclAllReduce(&v, &out, 1, ncclInt32, ncclSum, c, s) != ncclSuccess) return "capture call";
      if (cuStreamEndCapture(s, &g) != CUDA_SUCCESS) return "end capture";
      cuGraphInstantiate(&ge, g, 0);
      cuStreamSynchronize(s);
      if (out != 0) return "ran at capture";
      for (int i = 0; i < 3; ++i) {
        out = 0;
        cuGraphLaunch(ge, s);
        cuStreamSynchronize(s);
        if (out != 10) return "replay " + std::to_string(i) + " gave " + std::to_string(out);
        int w = 0;  // an eager collective between replays keeps the sequence aligned
        ncclAllReduce(&v, &w, 1, ncclInt32, ncclMax, c, s);
        cuStreamSynchronize(s);
        if (w != 4) return "eager max " + std::to_string(w);
      }
      ncclCommDestroy(c);
      return "";
    });
  }
}

// ---- fault injection, seen the way a wrapper sees it -----------------------------------------
// Hidden cases, run by ctest with NCCLWATCH_SIM_FAULT set (CMakeLists.txt). The process is
// global rank 0 and its clique's communicators have creation indices 0 and 1, so comm=1 picks
// clique rank 1. A "marker" is an event recorded right before the NCCL call, as ncclwatch does.
namespace {
struct FaultRun {
  // Buffers first: destroyed after the clique, whose destructor aborts what still runs.
  std::vector<Buf> in{Buf{1.0f}, Buf{2.0f}}, out{Buf{0.0f}, Buf{0.0f}};
  Clique q{2};
  CUevent marker[2];
  // sync: wait for collective 1 before going on (a host that does not run ahead).
  explicit FaultRun(bool sync = true) {
    Group([&] {  // collective 1, no fault
      for (int r = 0; r < 2; ++r)
        REQUIRE(ncclAllReduce(in[r].data(), out[r].data(), 1, ncclFloat, ncclSum, q.comms[r], q.streams[r]) == 0);
    });
    if (sync) q.SyncAll();
    for (auto& m : marker) REQUIRE(cuEventCreate(&m, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  }
  // Polls until `pred` holds (true) or 5 s passed (false): robust on a loaded machine.
  template <class P>
  static bool WaitFor(P pred) {
    for (auto end = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < end;
         std::this_thread::sleep_for(10ms))
      if (pred()) return true;
    return false;
  }
  // Collective 2 on rank r: marker, then the call. Returns the call's duration.
  std::chrono::milliseconds Issue(int r, ncclResult_t want = ncclSuccess) {
    REQUIRE(cuEventRecord(marker[r], q.streams[r]) == CUDA_SUCCESS);
    auto t0 = std::chrono::steady_clock::now();
    REQUIRE(ncclAllReduce(in[r].data(), out[r].data(), 1, ncclFloat, ncclSum, q.comms[r], q.streams[r]) == want);
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  }
};
}  // namespace

TEST_CASE("fault kernel: the stream is busy before the marker of collective N", "[.fault_kernel]") {
  // NCCLWATCH_SIM_FAULT=kernel:rank=0,seq=2,comm=1,ms=1500. The kernel runs after collective
  // 1 on the stream, so the host must not wait for collective 1 (it runs ahead, as in training).
  auto t0 = std::chrono::steady_clock::now();
  FaultRun f(false);
  CHECK(f.Issue(0) < 1000ms);
  CHECK(f.Issue(1) < 1000ms);  // the host is not delayed
  REQUIRE(FaultRun::WaitFor([&] { return cuEventQuery(f.marker[0]) == CUDA_SUCCESS; }));
  CHECK(cuEventQuery(f.marker[1]) == CUDA_ERROR_NOT_READY);  // the GPU has not reached it
  f.q.SyncAll();
  CHECK(std::chrono::steady_clock::now() - t0 >= 1400ms);
  CHECK((f.out[0][0] == 3.0f && f.out[1][0] == 3.0f));
}

TEST_CASE("fault stall: every rank reaches collective N, none completes", "[.fault_stall]") {
  // NCCLWATCH_SIM_FAULT=stall:rank=0,seq=2,comm=1
  FaultRun f;
  f.Issue(0);
  f.Issue(1);
  REQUIRE(FaultRun::WaitFor([&] {
    return cuEventQuery(f.marker[0]) == CUDA_SUCCESS && cuEventQuery(f.marker[1]) == CUDA_SUCCESS;
  }));
  std::this_thread::sleep_for(300ms);
  CHECK(cuStreamQuery(f.q.streams[0]) == CUDA_ERROR_NOT_READY);
  CHECK(cuStreamQuery(f.q.streams[1]) == CUDA_ERROR_NOT_READY);
  for (auto c : f.q.comms) ncclCommAbort(c);
  f.q.SyncAll();
}

TEST_CASE("fault delay: the host call of collective N sleeps", "[.fault_delay]") {
  // NCCLWATCH_SIM_FAULT=delay:rank=0,seq=2,comm=1,ms=600
  FaultRun f;
  CHECK(f.Issue(0) < 500ms);
  CHECK(f.Issue(1) >= 550ms);
  f.q.SyncAll();
  CHECK(f.out[1][0] == 3.0f);
}

TEST_CASE("fault error: the call fails and the async error turns remote", "[.fault_error]") {
  // NCCLWATCH_SIM_FAULT=error:rank=0,seq=2,comm=1
  FaultRun f;
  f.Issue(0);
  f.Issue(1, ncclSystemError);
  ncclResult_t e0 = ncclInternalError, e1 = ncclInternalError;
  ncclCommGetAsyncError(f.q.comms[0], &e0);
  ncclCommGetAsyncError(f.q.comms[1], &e1);
  CHECK(e0 == ncclSuccess);
  CHECK(e1 == ncclRemoteError);
  CHECK(std::string(ncclGetLastError(nullptr)).find("injected") != std::string::npos);
}

TEST_CASE("init inside a group from one thread, and ncclGroupSimulateEnd launches nothing") {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  const int n = 3;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclComm_t> comms(n);
  std::vector<CUstream> streams(n);
  Group([&] {  // would deadlock outside a group: each init waits for the others
    for (int r = 0; r < n; ++r) REQUIRE(ncclCommInitRank(&comms[r], n, id, r) == ncclSuccess);
  });
  for (auto& s : streams) REQUIRE(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
  std::vector<int> in{1, 2, 3}, out(n, 0);
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  REQUIRE(ncclGroupStart() == ncclSuccess);
  for (int r = 0; r < n; ++r)
    REQUIRE(ncclAllReduce(&in[r], &out[r], 1, ncclInt32, ncclSum, comms[r], streams[r]) == ncclSuccess);
  REQUIRE(ncclGroupSimulateEnd(&info) == ncclSuccess);
  CHECK(info.estimatedTime > 0);
  for (auto s : streams) REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(out == std::vector<int>{0, 0, 0});
  Group([&] {  // the simulated group did not consume a sequence number: this one matches
    for (int r = 0; r < n; ++r)
      REQUIRE(ncclAllReduce(&in[r], &out[r], 1, ncclInt32, ncclSum, comms[r], streams[r]) == ncclSuccess);
  });
  for (auto s : streams) REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(out == std::vector<int>{6, 6, 6});
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
  for (auto c : comms) REQUIRE(ncclCommDestroy(c) == ncclSuccess);
}
