#include "model/dump_set.h"

#include <dirent.h>

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <tuple>

#include "format/dump_reader.h"
#include "format/file_name.h"

namespace ncclwatch {
namespace analysis {

namespace {

// A dump whose summary has no rank: its rank in a full-size communicator is its global rank
// (the writer's own fallback), else in its largest communicator when that is the only hint.
int InferRank(const trace::Summary& s) {
  const trace::CommSummary* best = nullptr;
  for (const auto& c : s.comms) {
    if (c.rank < 0) continue;
    if (s.world_size > 0 && c.size == s.world_size) return c.rank;
    if (!best || c.size > best->size) best = &c;
  }
  return s.world_size <= 0 && best ? best->rank : trace::kUnknownRank;
}

}  // namespace

struct SummaryCache::Entry {
  uint64_t inode = 0;
  Dump dump;  // as read: before rank inference and selection
  trace::ReadResult result;
};

SummaryCache::SummaryCache() = default;
SummaryCache::~SummaryCache() = default;

bool DumpSet::Load(const std::string& dir, const LoadOptions& options, std::string* error) {
  dir_ = dir;
  std::vector<std::string> names;
  std::vector<uint64_t> inodes;
  if (!trace::ListDumpFiles(dir, &names, error, &inodes)) return false;
  files_seen_ = names.size();

  // Dumps and read results side by side; the usable dumps are then compacted in place, so that
  // one vector of dumps is alive at a time (at 131,072 ranks each is about 150 MB).
  std::vector<Dump> read(names.size());
  std::vector<trace::ReadResult> results(names.size());
  std::vector<char> fresh(names.size(), 1);  // read now, not taken from the cache
  SummaryCache* cache = options.cache;
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < names.size();) {
      auto hit = cache ? cache->entries_.find(names[i]) : decltype(cache->entries_.end()){};
      if (cache && hit != cache->entries_.end() && hit->second->inode == inodes[i]) {
        read[i] = hit->second->dump;
        results[i] = hit->second->result;
        fresh[i] = 0;
      } else {
        read[i].file_name = names[i];
        read[i].path = dir + "/" + names[i];
        results[i] = trace::ReadDumpFile(read[i].path, trace::ReadDepth::kSummary, &read[i]);
      }
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

  if (cache) {  // the files of this listing: those read now added, those gone forgotten
    decltype(cache->entries_) entries;
    entries.reserve(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      auto& e = entries[names[i]];
      if (fresh[i]) e.reset(new SummaryCache::Entry{inodes[i], read[i], results[i]});
      else e = std::move(cache->entries_[names[i]]);
    }
    cache->entries_ = std::move(entries);
  }

  size_t kept = 0;
  for (size_t i = 0; i < read.size(); ++i) {
    Dump& d = read[i];
    const trace::ReadResult& r = results[i];
    if (fresh[i]) {
      bytes_read_ += r.bytes_read;
      ++files_read_;
    }
    if (!r.usable) {
      AddProblem(d.file_name, ProblemKind::kUnreadable, r.problem);
      int claimed = RankFromFileName(d.file_name);
      if (claimed >= 0) unreadable_ranks_.emplace(claimed, d.file_name);
      continue;
    }
    if (!r.problem.empty()) AddProblem(d.file_name, ProblemKind::kReader, r.problem);
    if (d.summary.rank < 0) d.summary.rank = InferRank(d.summary);
    if (d.summary.rank < 0) {
      AddProblem(d.file_name, ProblemKind::kRankUnknown);
      continue;
    }
    if (kept != i) read[kept] = std::move(d);
    ++kept;
  }
  read.erase(read.begin() + static_cast<std::ptrdiff_t>(kept), read.end());
  results = {};
  names = {};
  inodes = {};
  Select(std::move(read), options.attempt);
  return true;
}

void DumpSet::LoadFromDumps(std::vector<Dump> dumps) {
  std::vector<Dump> usable;
  for (auto& d : dumps) {
    if (d.summary.rank < 0) d.summary.rank = InferRank(d.summary);
    if (d.summary.rank >= 0) usable.push_back(std::move(d));
  }
  files_seen_ = usable.size();
  Select(std::move(usable), 0);
}

namespace {

bool IsReason(const Dump& d, trace::DumpReason r) { return d.summary.reason == trace::DumpReasonName(r); }

// Dumps that follow a teardown's start in the same process: the crash of the framework's
// abort(), the launcher's SIGTERM, the exit after an NCCL error.
bool FollowsTeardown(const Dump& d) {
  using R = trace::DumpReason;
  return IsReason(d, R::FatalSignal) || IsReason(d, R::Signal) || IsReason(d, R::ExitInFlight) ||
         IsReason(d, R::Exit);
}

// Dumps that record the state when a hang's teardown began. Not a peer_request: a rank that
// answered one and was then stopped shows the same state in both, and an answer to a request
// left over from an earlier attempt must not outrank what the process did later.
bool StartsTeardown(const Dump& d) {
  using R = trace::DumpReason;
  return IsReason(d, R::Abort) || IsReason(d, R::Stall) || IsReason(d, R::NcclError) ||
         IsReason(d, R::AsyncError);
}

class UnionFind {
 public:
  explicit UnionFind(size_t n) : parent_(n) {
    for (size_t i = 0; i < n; ++i) parent_[i] = i;
  }
  size_t Find(size_t x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void Join(size_t a, size_t b) { parent_[Find(a)] = Find(b); }

 private:
  std::vector<size_t> parent_;
};

int64_t StartOf(const Dump& d) { return d.summary.start_unix_ns > 0 ? d.summary.start_unix_ns : d.summary.time_unix_ns; }

}  // namespace

std::vector<Dump> DumpSet::SplitAttempts(std::vector<Dump> usable, int wanted) {
  UnionFind uf(usable.size());
  std::unordered_map<std::string, size_t> first_with;  // key -> first dump index
  auto link = [&](const std::string& key, size_t i) {
    auto [it, inserted] = first_with.emplace(key, i);
    if (!inserted) uf.Join(i, it->second);
  };
  for (size_t i = 0; i < usable.size(); ++i) {
    const trace::Summary& s = usable[i].summary;
    link("p:" + usable[i].ProcessKey(), i);
    if (!s.job_instance.empty()) link("j:" + s.job_instance, i);
    for (const auto& c : s.comms) link("c:" + c.id, i);
  }
  std::map<size_t, std::vector<size_t>> groups;
  for (size_t i = 0; i < usable.size(); ++i) groups[uf.Find(i)].push_back(i);
  // A group with nothing to link it (no communicator, no job instance: a rank that never got
  // past setup) joins the latest linked group that started before it.
  struct Group {
    std::vector<size_t> members;
    int64_t start = INT64_MAX;
    bool linked = false;
  };
  std::vector<Group> linked, loose;
  for (auto& [root, members] : groups) {
    Group g;
    g.members = members;
    for (size_t i : members) {
      g.start = std::min(g.start, StartOf(usable[i]));
      g.linked = g.linked || !usable[i].summary.comms.empty() || !usable[i].summary.job_instance.empty();
    }
    (g.linked ? linked : loose).push_back(std::move(g));
  }
  // Only a rank seen twice tells attempts apart (a restart reuses rank numbers): groups with
  // disjoint ranks (sub-communicators with no common one) are one attempt. In start order,
  // each group joins the latest attempt it shares no rank with.
  std::sort(linked.begin(), linked.end(), [](const Group& a, const Group& b) { return a.start < b.start; });
  std::vector<Group> merged;
  std::vector<std::set<int>> merged_ranks;
  for (auto& g : linked) {
    std::set<int> ranks;
    for (size_t i : g.members) ranks.insert(usable[i].summary.rank);
    int home = -1;
    for (int a = static_cast<int>(merged.size()) - 1; a >= 0 && home < 0; --a) {
      bool disjoint = std::none_of(ranks.begin(), ranks.end(), [&](int r) { return merged_ranks[a].count(r) > 0; });
      if (disjoint) home = a;
    }
    if (home < 0) {
      merged.push_back(std::move(g));
      merged_ranks.push_back(std::move(ranks));
      continue;
    }
    merged[home].members.insert(merged[home].members.end(), g.members.begin(), g.members.end());
    merged[home].start = std::min(merged[home].start, g.start);
    merged_ranks[home].insert(ranks.begin(), ranks.end());
  }
  linked = std::move(merged);
  for (auto& g : loose) {
    Group* home = nullptr;
    for (auto& l : linked)
      if (l.start <= g.start) home = &l;
    if (home) home->members.insert(home->members.end(), g.members.begin(), g.members.end());
    else linked.push_back(std::move(g));
  }
  std::sort(linked.begin(), linked.end(), [](const Group& a, const Group& b) { return a.start < b.start; });

  attempts_.clear();
  for (size_t a = 0; a < linked.size(); ++a) {
    Attempt at;
    at.index = static_cast<int>(a + 1);
    at.start_unix_ns = linked[a].start;
    std::set<int> ranks;
    for (size_t i : linked[a].members) {
      usable[i].attempt = at.index;
      ranks.insert(usable[i].summary.rank);
      if (at.job_instance.empty()) at.job_instance = usable[i].summary.job_instance;
    }
    at.ranks.assign(ranks.begin(), ranks.end());
    at.files = linked[a].members.size();
    attempts_.push_back(std::move(at));
  }
  chosen_attempt_ = attempts_.empty() ? 0 : static_cast<int>(attempts_.size());
  if (wanted > 0 && wanted <= static_cast<int>(attempts_.size())) chosen_attempt_ = wanted;
  else if (wanted != 0)
    AddProblem("--attempt", ProblemKind::kNoSuchAttempt, "", "", wanted, static_cast<int64_t>(attempts_.size()));
  usable.erase(std::remove_if(usable.begin(), usable.end(), [&](const Dump& d) { return d.attempt != chosen_attempt_; }),
               usable.end());
  return usable;
}

void DumpSet::Select(std::vector<Dump> usable, int attempt) {
  usable = SplitAttempts(std::move(usable), attempt);
  // Sorted by index, each process key made once: the dumps themselves (over a KB each) move
  // once, into dumps_ or history_.
  std::vector<std::string> keys(usable.size());
  for (size_t i = 0; i < usable.size(); ++i) keys[i] = usable[i].ProcessKey();
  std::vector<size_t> order(usable.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Each process's dumps in order: the evidence is its latest, except that dumps following a
  // teardown's start (a crash after the framework's abort) give way to that start.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(keys[a], usable[a].summary.dump_seq, usable[a].file_name) <
           std::tie(keys[b], usable[b].summary.dump_seq, usable[b].file_name);
  });
  auto at = [&](size_t k) -> Dump& { return usable[order[k]]; };
  std::vector<size_t> latest_per_process;  // indices in usable
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin + 1;
    while (end < order.size() && keys[order[end]] == keys[order[begin]]) ++end;
    std::vector<bool> duplicate(end - begin, false);
    for (size_t i = begin + 1; i < end; ++i)
      if (at(i).summary.dump_seq == at(i - 1).summary.dump_seq) {
        duplicate[i - begin] = true;
        AddProblem(at(i).file_name, ProblemKind::kSameDumpSeq, "", at(i - 1).file_name);
      }
    size_t evidence = end - 1;
    while (evidence > begin && duplicate[evidence - begin]) --evidence;
    // Back over a teardown's later dumps, and over answers to other ranks' requests written
    // while it went on (a busy machine can take one between an abort and the SIGABRT after it).
    if (FollowsTeardown(at(evidence)))
      while (evidence > begin &&
             (FollowsTeardown(at(evidence)) || IsReason(at(evidence), trace::DumpReason::PeerRequest)))
        --evidence;
    if (!StartsTeardown(at(evidence))) evidence = end - 1;
    std::vector<std::string> then;
    for (size_t i = evidence + 1; i < end; ++i) then.push_back(at(i).summary.reason);
    for (size_t i = begin; i < end; ++i)
      if (i != evidence && !duplicate[i - begin]) history_.push_back(std::move(at(i)));
    at(evidence).then = std::move(then);
    latest_per_process.push_back(order[evidence]);
    begin = end;
  }
  keys = {};
  // Latest process for each rank (a restarted rank has a new pid): greatest wall-clock time.
  // Only dumps claiming the same rank are compared by wall clock, never events of two hosts.
  std::sort(latest_per_process.begin(), latest_per_process.end(), [&](size_t ia, size_t ib) {
    const Dump& a = usable[ia];
    const Dump& b = usable[ib];
    return std::tie(a.summary.rank, b.summary.time_unix_ns, a.file_name) <
           std::tie(b.summary.rank, a.summary.time_unix_ns, b.file_name);
  });
  dumps_.reserve(latest_per_process.size());
  for (size_t i : latest_per_process) {
    Dump& d = usable[i];
    if (!dumps_.empty() && dumps_.back().summary.rank == d.summary.rank) {
      const Dump& chosen = dumps_.back();
      if (chosen.summary.time_unix_ns == d.summary.time_unix_ns) {
        AddProblem(d.file_name, ProblemKind::kSameTimeClaim, "", chosen.file_name, d.summary.rank);
      } else {
        AddProblem(d.file_name, ProblemKind::kLaterClaim, "", chosen.file_name, d.summary.rank);
        history_.push_back(std::move(d));
      }
      continue;
    }
    dumps_.push_back(std::move(d));
  }
  usable = {};
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

void DumpSet::AddProblem(std::string file, ProblemKind kind, std::string message, std::string other,
                         int64_t number, int64_t count) {
  Problem p;
  p.file = std::move(file);
  p.kind = kind;
  p.message = std::move(message);
  p.other = std::move(other);
  p.number = number;
  p.count = count;
  problems_.push_back(std::move(p));
}

const trace::Detail* DumpSet::Detail(size_t index) {
  if (index >= dumps_.size()) return nullptr;
  Dump& d = dumps_[index];
  if (d.detail) return d.detail.get();
  if (!d.detail_problem.empty() || d.path.empty()) return nullptr;  // tried before, or in memory
  Dump full;
  trace::ReadResult r = trace::ReadDumpFile(d.path, trace::ReadDepth::kFull, &full);
  detail_bytes_read_ += r.bytes_read;
  ++details_read_;
  if (!r.usable || !full.detail) {
    d.detail_problem = r.problem.empty() ? "details unreadable" : r.problem;
    AddProblem(d.file_name, ProblemKind::kDetailsUnreadable, d.detail_problem);
    return nullptr;
  }
  if (!full.detail_problem.empty()) AddProblem(d.file_name, ProblemKind::kReader, full.detail_problem);
  d.detail = full.detail;
  return d.detail.get();
}


}  // namespace analysis
}  // namespace ncclwatch
