// What a dump costs per ring size: file size, time to write it and the extra peak memory of the
// process while writing it, for the way dumps are written now (trace format version 2, the live
// ring read entry by entry, the text streamed to the file in 64 KiB pieces) and for the way they
// were written before (version 1's ring of objects, the ring copied and the whole text built in
// memory, then written), measured in the same run.
//
//   bench_dump [--runs N] [--sizes 4096,65536,1048576] [--threads T]
//
// Each measurement runs in a fresh child process (so the peak resident set it reports is its
// own): the child fills a ring of the given size with realistic operations (two communicators,
// three collectives, sizes from 4 KiB to 16 MiB, times with jitter, every operation completed),
// then writes one full dump (T threads of 20 native frames, 8 call sites) into a temporary
// directory. Printed: medians over N children.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dump/dump_files.h"
#include "dump/dump_writer.h"
#include "format/json_writer.h"
#include "format/trace_writer.h"
#include "record/flight_ring.h"

using namespace ncclwatch;

namespace {

struct Result {
  double bytes = 0, ms = 0, extra_mib = 0;
};

long MaxRssKib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// A training step as FSDP issues it, repeated: per layer, an AllGather of the layer's
// parameters (forward), then in backward an AllGather again and a ReduceScatter of its
// gradients on the data-parallel communicator, and a small AllReduce on the tensor-parallel one;
// two layer sizes (attention, MLP), one call site per kind of call, jittered times.
void FillRing(FlightRing* ring, uint64_t ops) {
  std::mt19937_64 rng(42);
  const uint64_t dp = 0x3f2a9c11d0e4b570ull, tp = 0x81c0ffee12345678ull;
  struct Call {
    uint64_t comm;
    trace::OpKind kind;
    int32_t callsite;
  };
  const Call step[] = {{dp, trace::OpKind::AllGather, 0},
                       {tp, trace::OpKind::AllReduce, 1},
                       {dp, trace::OpKind::AllGather, 2},
                       {dp, trace::OpKind::ReduceScatter, 3}};
  const uint64_t layer_counts[] = {4194304, 11534336};  // attention, MLP parameters (bf16)
  uint64_t now = 1000000000, seq_dp = 0, seq_tp = 0, group = 0;
  for (uint64_t i = 0; i < ops; ++i) {
    const Call& call = step[i % 4];
    OpSnapshot o;
    o.comm_id = call.comm;
    o.seq = call.comm == dp ? ++seq_dp : ++seq_tp;
    o.kind = call.kind;
    o.count = call.comm == tp ? 8192 : layer_counts[(i / 4) % 2];
    o.dtype = 9;  // bfloat16
    o.bytes = o.count * 2;
    o.redop = call.kind == trace::OpKind::AllGather ? -1 : 0;
    o.stream = 0x7f3a20001000ull + (call.comm == tp ? 0x100 : 0);
    o.group = call.kind == trace::OpKind::ReduceScatter ? ++group : 0;
    o.tid = 31337;
    o.callsite = call.callsite;
    o.comm_size = 8;
    now += 150000 + rng() % 100000;
    o.enqueue_ns = now;
    uint64_t index = ring->Record(o);
    uint64_t reached = now + 5000 + rng() % 45000;
    ring->SetState(index, trace::OpState::GpuReached, reached);
    ring->SetState(index, trace::OpState::Completed, reached + 100000 + rng() % 4900000);
  }
}

std::vector<trace::Thread> Threads(int count) {
  std::vector<trace::Thread> threads;
  for (int t = 0; t < count; ++t) {
    trace::Thread th;
    th.tid = 31337 + t;
    th.name = "pt_autograd_" + std::to_string(t);
    for (int f = 0; f < 20; ++f)
      th.stack.native.push_back({0x7f3a10000000ull + 0x1000ull * f, "/usr/lib/python3/dist-packages/torch/lib/libtorch_cuda.so",
                                 "c10d::ProcessGroupNCCL::collective<...>::lambda" + std::to_string(f), 0x1c4,
                                 "6f1e2d3c4b5a69788796a5b4c3d2e1f001122334", 0x1000ull * f});
    threads.push_back(std::move(th));
  }
  return threads;
}

// One child's measurement. `streamed`: the product's path; else the old one, emulated.
Result MeasureInChild(uint64_t ring_size, bool streamed, int threads, const std::string& dir) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    FlightRing ring(ring_size);
    FillRing(&ring, ring_size + ring_size / 4);  // wrapped, as in a long run
    Config config;
    DumpInput in;
    in.reason = trace::DumpReason::Stall;
    in.detail = "AllGather seq 42 on comm 3f2a9c11d0e4b570 passed its 10.0 s deadline";
    in.identity.host = "node0001";
    in.identity.pid = getpid();
    in.global_rank = 3;
    in.world_size = 8;
    in.config = &config;
    in.ring_capacity = ring.capacity();
    in.ring_recorded = ring.recorded();
    in.ring_overwritten = ring.overwritten();
    in.threads = Threads(threads);
    for (int c = 0; c < 8; ++c) in.callsites.push_back({c, in.threads[0].stack, "", ""});
    DumpDirectory dumps(dir, dir, 1000000);
    const long base_kib = MaxRssKib();
    auto start = std::chrono::steady_clock::now();
    std::string path;
    if (streamed) {
      in.live_ring = &ring;
      in.ring_to = ring.recorded();
      in.ring_from = in.ring_to - ring.capacity();
      path = dumps.Write("bench", [&](const trace::TextSink& sink) { return StreamDump(in, sink); });
    } else {
      // Before: a copy of the ring, converted entries, and the whole text in one string.
      std::vector<OpSnapshot> copy = ring.Snapshot();
      std::vector<trace::Op> entries;
      for (const auto& o : copy) entries.push_back(OpRecordOf(o));
      std::string text = SerializeDump(in);  // everything but the ring
      std::string ring_text;
      trace::JsonWriter w(&ring_text);
      w.BeginArray();
      for (const auto& op : entries) trace::WriteOp(w, op);
      w.EndArray();
      text.insert(text.size() - 2, ",\"entries\":" + ring_text);
      path = dumps.Write("bench", text);
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    struct stat st {};
    stat(path.c_str(), &st);
    Result r{static_cast<double>(st.st_size), ms, (MaxRssKib() - base_kib) / 1024.0};
    if (!getenv("BENCH_DUMP_KEEP")) unlink(path.c_str());
    ssize_t ignored = write(fds[1], &r, sizeof r);
    (void)ignored;
    _exit(0);
  }
  close(fds[1]);
  Result r;
  ssize_t n = read(fds[0], &r, sizeof r);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (n != static_cast<ssize_t>(sizeof r)) std::fprintf(stderr, "bench_dump: a child failed\n");
  return r;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 3, threads = 32;
  std::vector<uint64_t> sizes = {4096, 65536, 1048576};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, atoi(argv[++i]));
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::max(1, atoi(argv[++i]));
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::stringstream ss(argv[++i]);
      std::string item;
      while (std::getline(ss, item, ',')) sizes.push_back(std::strtoull(item.c_str(), nullptr, 10));
    } else {
      std::fprintf(stderr, "usage: bench_dump [--runs N] [--sizes 4096,65536,1048576] [--threads T]\n");
      return 2;
    }
  }
  char tmpl[] = "/tmp/ncclwatch-bench-dump-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::printf("one full dump, %d threads of 20 frames; medians of %d runs (each in a fresh process)\n", threads, runs);
  std::printf("%-9s | %-44s | %-44s\n", "", "before: v1 ring, copied, text built in memory", "now: v2 ring, read live, streamed");
  std::printf("%-9s | %12s %12s %16s | %12s %12s %16s\n", "ring", "size MB", "time ms", "extra peak MiB", "size MB",
              "time ms", "extra peak MiB");
  for (uint64_t size : sizes) {
    Result med[2];
    for (int streamed = 0; streamed < 2; ++streamed) {
      std::vector<double> bytes, ms, mib;
      for (int r = 0; r < runs; ++r) {
        Result x = MeasureInChild(size, streamed, threads, dir);
        bytes.push_back(x.bytes);
        ms.push_back(x.ms);
        mib.push_back(x.extra_mib);
      }
      med[streamed] = {Median(bytes), Median(ms), Median(mib)};
    }
    std::printf("%-9llu | %12.3f %12.1f %16.1f | %12.3f %12.1f %16.1f\n", static_cast<unsigned long long>(size),
                med[0].bytes / 1e6, med[0].ms, med[0].extra_mib, med[1].bytes / 1e6, med[1].ms, med[1].extra_mib);
  }
  rmdir(dir.c_str());
  return 0;
}
