#include "dump_set.h"

#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <tuple>

#include "dump_reader.h"
#include "format/file_name.h"

namespace ncclwatch {
namespace analysis {

namespace {

bool ListDumpFiles(const std::string& dir, std::vector<std::string>* names, std::string* error) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    *error = dir + ": " + std::strerror(errno);
    return false;
  }
  while (struct dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (trace::IsDumpFileName(name)) names->push_back(std::move(name));
  }
  ::closedir(d);
  std::sort(names->begin(), names->end());
  return true;
}

// A dump whose summary has no rank: its rank in a full-size communicator is its global rank
// (the writer's own fallback), else in its largest communicator when that is the only hint.
int InferRank(const DumpSummary& s) {
  const CommSummary* best = nullptr;
  for (const auto& c : s.comms) {
    if (c.rank < 0) continue;
    if (s.world_size > 0 && c.size == s.world_size) return c.rank;
    if (!best || c.size > best->size) best = &c;
  }
  return s.world_size <= 0 && best ? best->rank : kUnknownRank;
}

}  // namespace

bool DumpSet::Load(const std::string& dir, const LoadOptions& options, std::string* error) {
  dir_ = dir;
  std::vector<std::string> names;
  if (!ListDumpFiles(dir, &names, error)) return false;
  files_seen_ = names.size();

  struct Slot {
    Dump dump;
    ReadResult result;
  };
  std::vector<Slot> slots(names.size());
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < names.size();) {
      slots[i].dump.file_name = names[i];
      slots[i].dump.path = dir + "/" + names[i];
      slots[i].result = ReadDumpFile(slots[i].dump.path, ReadDepth::kSummary, &slots[i].dump);
      done.fetch_add(1);
    }
  };
  unsigned n = options.threads ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  n = static_cast<unsigned>(std::min<size_t>(n, std::max<size_t>(1, names.size())));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < n; ++t) pool.emplace_back(worker);
  if (options.progress) {
    // This thread reports progress while the others read; it reads too once they are started.
    std::thread reporter([&] {
      size_t last = 0;
      while (last < names.size()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        size_t d = done.load();
        if (d != last) options.progress(d, names.size());
        last = d;
      }
    });
    worker();
    for (auto& t : pool) t.join();
    reporter.join();
  } else {
    worker();
    for (auto& t : pool) t.join();
  }

  std::vector<Dump> usable;
  usable.reserve(slots.size());
  for (auto& s : slots) {
    bytes_read_ += s.result.bytes_read;
    if (!s.result.usable) {
      problems_.push_back({s.dump.file_name, s.result.problem + "; skipped"});
      int claimed = RankFromFileName(s.dump.file_name);
      if (claimed >= 0) unreadable_ranks_.emplace(claimed, s.dump.file_name);
      continue;
    }
    if (s.dump.summary.rank < 0) s.dump.summary.rank = InferRank(s.dump.summary);
    if (s.dump.summary.rank < 0) {
      problems_.push_back({s.dump.file_name,
                           "global rank unknown (summary.rank is -1 and no full-size "
                           "communicator); skipped"});
      continue;
    }
    usable.push_back(std::move(s.dump));
  }
  Select(std::move(usable));
  return true;
}

void DumpSet::LoadFromDumps(std::vector<Dump> dumps) {
  std::vector<Dump> usable;
  for (auto& d : dumps) {
    if (d.summary.rank < 0) d.summary.rank = InferRank(d.summary);
    if (d.summary.rank >= 0) usable.push_back(std::move(d));
  }
  files_seen_ = usable.size();
  Select(std::move(usable));
}

void DumpSet::Select(std::vector<Dump> usable) {
  // Latest dump of each process: greatest dump_seq for the same host and pid.
  std::sort(usable.begin(), usable.end(), [](const Dump& a, const Dump& b) {
    return std::tie(a.summary.host, a.summary.pid, b.summary.dump_seq, a.file_name) <
           std::tie(b.summary.host, b.summary.pid, a.summary.dump_seq, b.file_name);
  });
  std::vector<Dump> latest_per_process;
  for (auto& d : usable) {
    if (!latest_per_process.empty()) {
      const Dump& prev = latest_per_process.back();
      bool same_process = prev.summary.host == d.summary.host && prev.summary.pid == d.summary.pid;
      if (same_process && prev.summary.dump_seq == d.summary.dump_seq) {
        problems_.push_back({d.file_name, "same host, pid and dump_seq as " + prev.file_name +
                                              "; skipped"});
        continue;
      }
      if (same_process) {
        history_.push_back(std::move(d));
        continue;
      }
    }
    latest_per_process.push_back(std::move(d));
  }
  // Latest process for each rank (a restarted rank has a new pid): greatest wall-clock time.
  // Only dumps claiming the same rank are compared by wall clock, never events of two hosts.
  std::sort(latest_per_process.begin(), latest_per_process.end(), [](const Dump& a, const Dump& b) {
    return std::tie(a.summary.rank, b.summary.time_unix_ns, a.file_name) <
           std::tie(b.summary.rank, a.summary.time_unix_ns, b.file_name);
  });
  for (auto& d : latest_per_process) {
    if (!dumps_.empty() && dumps_.back().summary.rank == d.summary.rank) {
      const Dump& chosen = dumps_.back();
      if (chosen.summary.time_unix_ns == d.summary.time_unix_ns) {
        problems_.push_back({d.file_name, "claims rank " + std::to_string(d.summary.rank) +
                                              " at the same time as " + chosen.file_name +
                                              "; skipped"});
      } else {
        history_.push_back(std::move(d));
      }
      continue;
    }
    dumps_.push_back(std::move(d));
  }
  for (size_t i = 0; i < dumps_.size(); ++i) by_rank_[dumps_[i].summary.rank] = i;
  for (auto it = unreadable_ranks_.begin(); it != unreadable_ranks_.end();)
    it = by_rank_.count(it->first) ? unreadable_ranks_.erase(it) : std::next(it);
  ComputeWorldSize();
}

void DumpSet::ComputeWorldSize() {
  // The declared world size wins; communicator sizes only count when no dump declares one
  // (and are bounded: a corrupt size must not invent a million missing ranks).
  constexpr int kMaxInferredWorld = 1 << 20;
  int declared = 0, inferred = 0;
  for (const auto& d : dumps_) {
    declared = std::max(declared, d.summary.world_size);
    inferred = std::max(inferred, d.summary.rank + 1);
    for (const auto& c : d.summary.comms) inferred = std::max(inferred, std::min(c.size, kMaxInferredWorld));
  }
  int highest_rank = dumps_.empty() ? 0 : dumps_.back().summary.rank + 1;  // dumps_ sorted by rank
  world_size_ = declared > 0 ? std::max(declared, highest_rank) : inferred;
}

int DumpSet::IndexOfRank(int rank) const {
  auto it = by_rank_.find(rank);
  return it == by_rank_.end() ? -1 : static_cast<int>(it->second);
}

const DumpDetail* DumpSet::Detail(size_t index) {
  if (index >= dumps_.size()) return nullptr;
  Dump& d = dumps_[index];
  if (d.detail) return d.detail.get();
  if (!d.detail_problem.empty() || d.path.empty()) return nullptr;  // tried before, or in memory
  Dump full;
  ReadResult r = ReadDumpFile(d.path, ReadDepth::kFull, &full);
  detail_bytes_read_ += r.bytes_read;
  ++details_read_;
  if (!r.usable || !full.detail) {
    d.detail_problem = r.problem.empty() ? "details unreadable" : r.problem;
    problems_.push_back({d.file_name, d.detail_problem + "; details not used"});
    return nullptr;
  }
  if (!full.detail_problem.empty()) problems_.push_back({d.file_name, full.detail_problem});
  d.detail = full.detail;
  return d.detail.get();
}

void DumpSet::AddProblem(std::string file, std::string problem) {
  problems_.push_back({std::move(file), std::move(problem)});
}

}  // namespace analysis
}  // namespace ncclwatch
