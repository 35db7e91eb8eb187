#include "model/dump_set.h"
#include "model/rank_split.h"

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

bool OfJobInstance(const std::string& instance, const std::string& wanted) {
  return instance == wanted || (instance.size() > wanted.size() && instance.compare(0, wanted.size(), wanted) == 0 &&
                                instance[wanted.size()] == '/');
}

SummaryCache::SummaryCache() = default;
SummaryCache::~SummaryCache() = default;

bool DumpSet::Load(const std::string& dir, const LoadOptions& options, std::string* error) {
  dir_ = dir;
  std::vector<std::string> names;
  std::vector<uint64_t> inodes;
  if (!trace::ListDumpFiles(dir, &names, error, &inodes)) {
    if (options.in_memory.empty()) return false;
    error->clear();  // a directory never made (every rank killed before its first dump): what is in memory
  }
  files_seen_ = names.size();

  // Dumps and read results side by side; the usable dumps are then compacted in place, so that
  // one vector of dumps is alive at a time (at 131,072 ranks each is about 150 MB).
  std::vector<Dump> read(names.size());
  std::vector<trace::ReadResult> results(names.size());
  std::vector<char> fresh(names.size(), 1);  // read now, not taken from the cache
  const auto shared_dir = std::make_shared<const std::string>(dir);
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
        if (!cache) std::string().swap(names[i]);  // one copy of 131,072 names (the cache keys them)
        read[i].dir = shared_dir;
        results[i] = trace::ReadDumpFile(read[i].Path(), trace::ReadDepth::kSummary, &read[i]);
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

  size_t kept = 0, newer = 0;  // files of a newer ncclwatch: one problem for all, said of the first
  std::vector<Dump> shares;    // the ranks of processes that drive several
  std::string newer_file, newer_problem;
  for (size_t i = 0; i < read.size(); ++i) {
    Dump& d = read[i];
    const trace::ReadResult& r = results[i];
    if (fresh[i]) {
      bytes_read_ += r.bytes_read;
      ++files_read_;
    }
    if (r.usable && !options.job_instance.empty() && !OfJobInstance(d.summary.job_instance, options.job_instance)) {
      ++other_jobs_files_;  // another job's: neither evidence nor a problem of this one
      continue;
    }
    if (!r.usable) {
      if (!r.newer_version) AddProblem(d.file_name, ProblemKind::kUnreadable, r.problem);
      else if (newer++ == 0) newer_file = d.file_name, newer_problem = r.problem;
      int claimed = RankFromFileName(d.file_name);
      if (claimed >= 0) unreadable_ranks_.emplace(claimed, d.file_name);
      continue;
    }
    if (!r.problem.empty()) AddProblem(d.file_name, ProblemKind::kReader, r.problem);
    std::vector<Dump> ranks = SplitByRank(std::move(d));
    if (ranks.size() > 1) {  // a process that drives several ranks: one dump each
      for (Dump& one : ranks) shares.push_back(std::move(one));
      continue;
    }
    d = std::move(ranks.front());
    if (d.summary.rank < 0) d.summary.rank = InferRank(d.summary);
    if (d.summary.rank < 0) {
      AddProblem(d.file_name, ProblemKind::kRankUnknown);
      continue;
    }
    if (kept != i) read[kept] = std::move(d);
    ++kept;
  }
  if (newer > 0) AddProblem(newer_file, ProblemKind::kNewerVersion, newer_problem, {}, 0, static_cast<int64_t>(newer));
  read.erase(read.begin() + static_cast<std::ptrdiff_t>(kept), read.end());
  for (Dump& d : shares) read.push_back(std::move(d));
  shares = {};
  for (const Dump& given : options.in_memory) {
    ++files_seen_;
    if (!options.job_instance.empty() && !OfJobInstance(given.summary.job_instance, options.job_instance)) {
      ++other_jobs_files_;
      continue;
    }
    for (Dump& d : SplitByRank(given)) {
      if (d.summary.rank < 0) d.summary.rank = InferRank(d.summary);
      if (d.summary.rank < 0) {
        AddProblem(d.file_name, ProblemKind::kRankUnknown);
        continue;
      }
      read.push_back(std::move(d));
    }
  }
  results = {};
  names = {};
  inodes = {};
  Select(std::move(read), options.attempt);
  return true;
}

void DumpSet::LoadFromDumps(std::vector<Dump> dumps) {
  std::vector<Dump> usable;
  for (auto& given : dumps)
    for (Dump& d : SplitByRank(std::move(given))) {
      if (d.summary.rank < 0) d.summary.rank = InferRank(d.summary);
      if (d.summary.rank >= 0) usable.push_back(std::move(d));
    }
  files_seen_ = usable.size();
  Select(std::move(usable), 0);
}

namespace {

// Dumps that follow a teardown's start in the same process: the crash of the framework's
// abort(), the launcher's SIGTERM, the exit after an NCCL error.
bool FollowsTeardown(const Dump& d) {
  using R = trace::DumpReason;
  const trace::DumpReasonValue& r = d.summary.reason;
  return r.Is(R::FatalSignal) || r.Is(R::Signal) || r.Is(R::ExitInFlight) || r.Is(R::Exit) || r.Is(R::Postmortem);
}

// A teardown's SIGTERM (or the like) every other rank answered, this much later than a rank's
// latest dump: that rank was gone before it.
constexpr int64_t kGoneBeforeTeardownNs = 10'000'000'000;

// Dumps that record the state when a hang's teardown began. Not a peer_request: a rank that
// answered one and was then stopped shows the same state in both, and an answer to a request
// left over from an earlier attempt must not outrank what the process did later.
bool StartsTeardown(const Dump& d) {
  using R = trace::DumpReason;
  const trace::DumpReasonValue& r = d.summary.reason;
  return r.Is(R::Abort) || r.Is(R::Stall) || r.Is(R::NcclError) || r.Is(R::AsyncError);
}

// An abort with an operation in flight for longer than a shutdown takes: the framework's
// reaction to a hang (its timeout), not the process's own way out.
bool AbortOfAHang(const Dump& d) {
  return std::any_of(d.summary.in_flight.begin(), d.summary.in_flight.end(),
                     [](const trace::Op& op) { return op.age_s >= kFrameworkTimeoutMinS; });
}

// An NCCL error of a call on a communicator its own process had aborted (the framework's
// thread aborts while the training thread goes on to its next collective): a consequence of the
// abort, part of the teardown, never a cause. Only the process's own ncclCommAbort makes a
// communicator `aborted` in its dumps.
bool ErrorAfterOwnAbort(const Dump& d) {
  if (!d.summary.reason.Is(trace::DumpReason::NcclError) && !d.summary.reason.Is(trace::DumpReason::AsyncError)) return false;
  const std::string aborted = trace::CommStateName(trace::CommState::Aborted);
  if (d.summary.failed) {
    const trace::CommSummary* c = d.summary.Comm(d.summary.failed->comm);
    return c && c->state == aborted;
  }
  return !d.summary.comms.empty() &&
         std::all_of(d.summary.comms.begin(), d.summary.comms.end(),
                     [&](const trace::CommSummary& c) { return c.state == aborted; });
}

// Whether `later` (a dump of the same process: `waiting` itself, or one after it) shows aborted
// a communicator that `waiting` shows waited on: operations issued and not completed, or in flight.
bool AbortedItsWait(const Dump& waiting, const Dump& later) {
  const std::string aborted = trace::CommStateName(trace::CommState::Aborted);
  auto aborted_later = [&](const std::string& id) {
    const trace::CommSummary* c = later.summary.Comm(id);
    return c && c->state == aborted;
  };
  for (const auto& c : waiting.summary.comms)
    if (c.last_enqueued > c.last_completed && aborted_later(c.id)) return true;
  for (const auto& op : waiting.summary.in_flight)
    if (aborted_later(op.comm)) return true;
  return false;
}

// A recovery dump written while its process had a communicator aborted: libraries before the
// `aborted` operation state counted the operations an abort released as completed, and wrote
// that as a recovery. It is the teardown, not a recovery. (Its list of recoveries is read later:
// the communicators' states tell.)
bool RecoveryOfAnAbort(const Dump& d) {
  const std::string aborted = trace::CommStateName(trace::CommState::Aborted);
  return d.summary.reason.Is(trace::DumpReason::Recovery) &&
         std::any_of(d.summary.comms.begin(), d.summary.comms.end(),
                     [&](const trace::CommSummary& c) { return c.state == aborted; });
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

// Whether `d` shows operation `op` completed: a collective by its sequence number, a Send/Recv
// by the count of completed transfers with its peer (its p2p sequence number). An aborted
// communicator counts its operations as ended: that is the teardown, not the operation
// completing. An operation it cannot place (no sequence number) did not complete.
bool CompletedIn(const Dump& d, const trace::Op& op) {
  const trace::CommSummary* c = d.summary.Comm(op.comm);
  if (!c || c->state == trace::CommStateName(trace::CommState::Aborted)) return false;
  // Captured into a CUDA graph (counted complete at capture): a replay of it is over where a
  // dump shows a later replay of it (replays are counted per process: see StallEndedIn).
  if (op.replays >= 0) {
    for (const trace::Op& o : d.summary.in_flight)
      if (o.replays >= 0 && o.comm == op.comm && o.seq == op.seq && o.p2p_seq == op.p2p_seq && o.peer == op.peer)
        return o.replays > op.replays;
    return false;
  }
  if (!op.IsP2p()) return op.seq > 0 && c->last_completed >= op.seq;
  if (op.p2p_seq <= 0) return false;
  for (const auto& p : c->p2p)
    if (p.peer == op.peer)
      return (op.op == trace::OpKind::Send ? p.send_completed : p.recv_completed) >= op.p2p_seq;
  return false;
}

// A stall dump of a communicator's creation (no `stalled` operation): the communicators it was
// creating.
std::vector<const trace::CommSummary*> CreationsOf(const Dump& d) {
  std::vector<const trace::CommSummary*> out;
  const std::string initializing = trace::CommStateName(trace::CommState::Initializing);
  for (const auto& c : d.summary.comms)
    if (c.state == initializing) out.push_back(&c);
  return out;
}

// Whether `later`, a later dump of the same process, saw the stall of `stall` end: its
// operation completed, or the creations it was in returned (the communicator created, or a
// split's own id gone). A black box's postmortem does not list creations: it tells nothing.
bool StallEndedIn(const Dump& stall, const Dump& later) {
  const trace::Op* captured = stall.summary.stalled && stall.summary.stalled->replays >= 0 ? &*stall.summary.stalled : nullptr;
  if (captured && !later.summary.reason.Is(trace::DumpReason::Postmortem)) {
    // The same process, later: its replay ended if no replay of it is under way any more.
    for (const trace::Op& o : later.summary.in_flight)
      if (o.replays >= 0 && o.comm == captured->comm && o.seq == captured->seq && o.p2p_seq == captured->p2p_seq &&
          o.peer == captured->peer)
        return o.replays > captured->replays;
    return true;
  }
  if (stall.summary.stalled) return CompletedIn(later, *stall.summary.stalled);
  const auto creating = CreationsOf(stall);
  const std::string initializing = trace::CommStateName(trace::CommState::Initializing);
  return !creating.empty() && !later.summary.reason.Is(trace::DumpReason::Postmortem) &&
         std::all_of(creating.begin(), creating.end(), [&](const trace::CommSummary* c) {
           const trace::CommSummary* now = later.summary.Comm(c->id);
           return !now || now->state != initializing;
         });
}

// Puts (*v)[from[k]] at (*v)[k] for each k, then cuts *v to from.size(); `from` holds distinct
// indices. In place, one swap per element.
template <typename T>
void GatherInPlace(std::vector<T>* v, const std::vector<size_t>& from) {
  std::vector<size_t> where(v->size()), holds(v->size());  // original index <-> position now
  for (size_t i = 0; i < v->size(); ++i) where[i] = holds[i] = i;
  for (size_t k = 0; k < from.size(); ++k) {
    const size_t p = where[from[k]];
    if (p == k) continue;
    std::swap((*v)[k], (*v)[p]);
    const size_t displaced = holds[k];
    where[displaced] = p;
    holds[p] = displaced;
    where[from[k]] = k;
    holds[k] = from[k];
  }
  v->erase(v->begin() + static_cast<std::ptrdiff_t>(from.size()), v->end());
}

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
    std::string instance;  // its job instance, "" unknown
  };
  std::vector<Group> linked, loose;
  for (auto& [root, members] : groups) {
    Group g;
    g.members = members;
    for (size_t i : members) {
      g.start = std::min(g.start, StartOf(usable[i]));
      g.linked = g.linked || !usable[i].summary.comms.empty() || !usable[i].summary.job_instance.empty();
      if (g.instance.empty()) g.instance = usable[i].summary.job_instance;
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
      // Two jobs that name themselves differently are never one (two jobs in one directory).
      bool same_job = g.instance.empty() || merged[a].instance.empty() || g.instance == merged[a].instance;
      if (disjoint && same_job) home = a;
    }
    if (home < 0) {
      merged.push_back(std::move(g));
      merged_ranks.push_back(std::move(ranks));
      continue;
    }
    merged[home].members.insert(merged[home].members.end(), g.members.begin(), g.members.end());
    merged[home].start = std::min(merged[home].start, g.start);
    if (merged[home].instance.empty()) merged[home].instance = g.instance;
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

void DumpSet::SeparateLaunches(std::vector<Dump>* usable) {
  shared_launches_ = {};
  // One launch (every job but a few): one world communicator among all the dumps, found without
  // a copy; the processes' maps below are built only where there are two.
  const std::string* one_world = nullptr;
  bool two_worlds = false;
  for (const Dump& d : *usable) {
    if (d.SharedProcess() || d.summary.rank < 0 || d.summary.world_size <= 0) continue;
    for (const auto& c : d.summary.comms)
      if (!c.id.empty() && c.size == d.summary.world_size && c.rank == d.summary.rank) {
        if (one_world == nullptr) one_world = &c.id;
        two_worlds = two_worlds || c.id != *one_world;
        break;
      }
    if (two_worlds) break;
  }
  if (!two_worlds) return;
  // Each process (host, pid, process uid): the RANK it claims, and its communicators (id ->
  // size, rank) over all its dumps. Its launch is its world communicator: size world_size,
  // rank RANK.
  struct Proc {
    int rank = -1, world_size = 0;
    std::string world;
    std::map<std::string, std::pair<int, int>> comms;
  };
  std::map<std::string, Proc> procs;
  for (const Dump& d : *usable) {
    if (d.SharedProcess() || d.summary.rank < 0 || d.summary.world_size <= 0) continue;
    Proc& p = procs[d.ProcessOnlyKey()];
    p.rank = d.summary.rank;
    p.world_size = d.summary.world_size;
    for (const auto& c : d.summary.comms) {
      if (c.id.empty() || c.rank < 0 || c.size <= 0) continue;
      p.comms[c.id] = {c.size, c.rank};
      if (p.world.empty() && c.size == d.summary.world_size && c.rank == d.summary.rank) p.world = c.id;
    }
  }
  std::map<std::string, std::vector<std::pair<const std::string*, const Proc*>>> launches;  // world comm -> processes
  for (const auto& [key, p] : procs)
    if (!p.world.empty()) launches[p.world].push_back({&key, &p});
  if (launches.size() < 2) return;
  // The communicator they share: the largest one held by processes of two launches or more
  // (a restarted launch shares none with the one before it: its communicators are new).
  std::map<std::string, std::set<std::string>> comm_launches;
  std::map<std::string, int> comm_size;
  for (const auto& [world, ps] : launches)
    for (const auto& kp : ps)
      for (const auto& [id, size_rank] : kp.second->comms) {
        comm_launches[id].insert(world);
        comm_size[id] = size_rank.first;
      }
  std::string shared;
  for (const auto& [id, worlds] : comm_launches)
    if (worlds.size() >= 2 && (shared.empty() || comm_size[id] > comm_size[shared])) shared = id;
  if (shared.empty()) return;
  // Each launch in it is a block: every process of the launch holds it, at rank first + RANK,
  // and no two processes hold one rank of it. Anything else stays as it was.
  SharedLaunches out;
  out.comm = shared;
  out.comm_size = comm_size[shared];
  std::set<int> taken;
  std::map<std::string, int> new_rank;  // process -> its rank in the shared communicator
  for (const auto& [world, ps] : launches) {
    if (!comm_launches[shared].count(world)) continue;
    int first = INT_MIN;
    for (const auto& [key, p] : ps) {
      auto it = p->comms.find(shared);
      if (it == p->comms.end()) return;
      const int at = it->second.second;
      if (first == INT_MIN) first = at - p->rank;
      if (at - p->rank != first || !taken.insert(at).second) return;
      new_rank[*key] = at;
    }
    out.launches.push_back({world, ps.front().second->world_size, first});
  }
  if (out.launches.size() < 2) return;
  std::sort(out.launches.begin(), out.launches.end(),
            [](const Launch& a, const Launch& b) { return a.first_rank < b.first_rank; });
  for (Dump& d : *usable) {
    if (d.SharedProcess()) continue;
    auto it = new_rank.find(d.ProcessOnlyKey());
    if (it == new_rank.end()) continue;
    d.summary.rank = it->second;
    d.summary.world_size = out.comm_size;
  }
  shared_launches_ = std::move(out);
}

bool DumpSet::LaunchOf(int rank, int* launch, int* launch_rank) const {
  const auto& ls = shared_launches_.launches;
  for (size_t i = 0; i < ls.size(); ++i)
    if (rank >= ls[i].first_rank && rank < ls[i].first_rank + ls[i].world_size) {
      *launch = static_cast<int>(i);
      *launch_rank = rank - ls[i].first_rank;
      return true;
    }
  return false;
}

void DumpSet::Select(std::vector<Dump> usable, int attempt) {
  usable = SplitAttempts(std::move(usable), attempt);
  // Two launches sharing a communicator repeat RANK numbers: each process takes its rank in
  // the shared communicator before any two claims of one rank are compared.
  SeparateLaunches(&usable);
  // Sorted by index, each process key made once: the dumps themselves (over a KB each) move
  // once, into dumps_ or history_.
  std::vector<std::string> keys(usable.size());
  for (size_t i = 0; i < usable.size(); ++i) keys[i] = usable[i].ProcessKey();
  std::vector<size_t> order(usable.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Each process's dumps in order: the evidence is its latest, except that dumps following a
  // teardown's start (a crash after the framework's abort) give way to that start.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto oa = usable[a].WriteOrder(), ob = usable[b].WriteOrder();
    return std::tie(keys[a], oa, usable[a].file_name) < std::tie(keys[b], ob, usable[b].file_name);
  });
  auto at = [&](size_t k) -> Dump& { return usable[order[k]]; };
  std::vector<size_t> latest_per_process;  // indices in usable
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin + 1;
    while (end < order.size() && keys[order[end]] == keys[order[begin]]) ++end;
    std::vector<bool> duplicate(end - begin, false);
    for (size_t i = begin + 1; i < end; ++i)
      if (at(i).WriteOrder() == at(i - 1).WriteOrder()) {
        duplicate[i - begin] = true;
        AddProblem(at(i).file_name, ProblemKind::kSameDumpSeq, "", at(i - 1).file_name);
      }
    size_t evidence = end - 1;
    while (evidence > begin && duplicate[evidence - begin]) --evidence;
    // Back over a teardown's later dumps, and over answers to other ranks' requests written
    // while it went on (a busy machine can take one between an abort and the SIGABRT after it).
    if (FollowsTeardown(at(evidence)) || ErrorAfterOwnAbort(at(evidence)))
      while (evidence > begin && (FollowsTeardown(at(evidence)) || RecoveryOfAnAbort(at(evidence)) ||
                                  ErrorAfterOwnAbort(at(evidence)) ||
                                  at(evidence).summary.reason.Is(trace::DumpReason::PeerRequest)))
        --evidence;
    // Its own way out: an abort with nothing waiting (a `finally:` that destroys the process
    // group as an exception passes, a shutdown), then its exit: the exit says how it ended.
    bool aborted_before_exit = false;
    if (at(evidence).summary.reason.Is(trace::DumpReason::Abort) && !AbortOfAHang(at(evidence)) &&
        (at(end - 1).summary.reason.Is(trace::DumpReason::Exit) ||
         at(end - 1).summary.reason.Is(trace::DumpReason::ExitInFlight))) {
      evidence = end - 1;
      aborted_before_exit = true;
    }
    // A stall whose operation completed in a later dump recovered: it started no teardown.
    auto recovered = [&](size_t i) {
      if (!at(i).summary.reason.Is(trace::DumpReason::Stall)) return false;
      for (size_t j = i + 1; j < end; ++j)
        if (StallEndedIn(at(i), at(j))) return true;
      return false;
    };
    if (!StartsTeardown(at(evidence)) || recovered(evidence)) {
      evidence = end - 1;
      // Killed after it answered the teardown's SIGTERM (the launcher's SIGKILL after its grace
      // period): where it was when the teardown began is in that answer.
      for (size_t i = end - 1; i > begin && at(evidence).summary.reason.Is(trace::DumpReason::Postmortem); --i) {
        if (at(i - 1).summary.reason.Is(trace::DumpReason::Signal)) evidence = i - 1;
        else if (!at(i - 1).summary.reason.Is(trace::DumpReason::PeerRequest)) break;
      }
    }
    // Ended by its framework after the wait: it aborted a communicator it waited on in a hang
    // (its abort, or any dump from its evidence on, shows it aborted mid-wait), then ended.
    std::optional<Dump::FrameworkEnding> framework_ending;
    if (FollowsTeardown(at(end - 1)) && !aborted_before_exit) {
      const Dump& e = at(evidence);
      bool hang = (e.summary.reason.Is(trace::DumpReason::Abort) && AbortOfAHang(e)) ||
                  (StartsTeardown(e) && !e.summary.reason.Is(trace::DumpReason::Abort)) || AbortedItsWait(e, e);
      bool aborted = false;
      for (size_t i = evidence; i < end && !aborted; ++i)
        aborted = at(i).summary.reason.Is(trace::DumpReason::Abort) || AbortedItsWait(e, at(i));
      if (hang && aborted) {
        const trace::Summary& last = at(end - 1).summary;
        framework_ending = Dump::FrameworkEnding{last.reason.Name(), last.exit_status, last.detail};
      }
    }
    std::vector<std::string> then;
    for (size_t i = evidence + 1; i < end; ++i) then.push_back(at(i).summary.reason.Name());
    at(evidence).last_reason = at(end - 1).summary.reason.Name();
    at(evidence).last_time_unix_ns = at(end - 1).summary.time_unix_ns;
    for (size_t i = begin; i < end; ++i)
      if (i != evidence && !duplicate[i - begin]) history_.push_back(std::move(at(i)));
    at(evidence).then = std::move(then);
    at(evidence).aborted_before_exit = aborted_before_exit;
    at(evidence).framework_ending = std::move(framework_ending);
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
  std::vector<size_t> evidence;  // indices in usable, in the order of dumps_
  evidence.reserve(latest_per_process.size());
  for (size_t i : latest_per_process) {
    Dump& d = usable[i];
    if (!evidence.empty() && usable[evidence.back()].summary.rank == d.summary.rank) {
      const Dump& chosen = usable[evidence.back()];
      if (chosen.summary.time_unix_ns == d.summary.time_unix_ns) {
        AddProblem(d.file_name, ProblemKind::kSameTimeClaim, "", chosen.file_name, d.summary.rank);
      } else {
        AddProblem(d.file_name, ProblemKind::kLaterClaim, "", chosen.file_name, d.summary.rank);
        history_.push_back(std::move(d));
      }
      continue;
    }
    evidence.push_back(i);
  }
  // In usable's own array: a second array of dumps (over a KB each) is 190 MB at 131,072 ranks.
  GatherInPlace(&usable, evidence);
  if (dumps_.empty()) {
    dumps_ = std::move(usable);
  } else {
    for (Dump& d : usable) dumps_.push_back(std::move(d));
  }
  usable = {};
  LeaveOutUnanswered();
  MarkGoneBeforeTeardown();
  for (size_t i = 0; i < dumps_.size(); ++i) by_rank_[dumps_[i].summary.rank] = i;
  IndexProcesses();
  for (auto it = unreadable_ranks_.begin(); it != unreadable_ranks_.end();)
    it = by_rank_.count(it->first) ? unreadable_ranks_.erase(it) : std::next(it);
  ComputeWorldSize();
}

void DumpSet::LeaveOutUnanswered() {
  // Each request's first answer among the evidence; the newest round is the request whose
  // first answer is the latest. Every rank alive answers every request (the library's rule):
  // a rank whose evidence answers an earlier one, taken before that round, did not.
  std::map<std::string, int64_t> first_answer;
  for (const auto& d : dumps_)
    if (d.summary.reason.Is(trace::DumpReason::PeerRequest) && d.summary.answered && d.summary.time_unix_ns > 0) {
      auto [it, inserted] = first_answer.emplace(d.summary.answered->request, d.summary.time_unix_ns);
      if (!inserted) it->second = std::min(it->second, d.summary.time_unix_ns);
    }
  if (first_answer.size() < 2) return;
  auto newest = std::max_element(first_answer.begin(), first_answer.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
  // A rank that answered the newest round too, in an earlier dump of its own, did answer it:
  // two requests of one episode (hosts that asked at once, each through the launcher's store)
  // reach ranks in either order, and its latest dump then answers the other one. So did the
  // rank that asked, when the evidence holds the dump that made it ask (the library writes a
  // request right after its own dump: its stall's, its abort's), which is its answer; without
  // that dump its latest is from before the round, as any other rank's that did not answer.
  std::set<int> answered_newest;
  const trace::AnsweredRequest* newest_request = nullptr;
  for (const auto* list : {&dumps_, &history_})
    for (const auto& d : *list)
      if (d.summary.answered && d.summary.answered->request == newest->first) {
        answered_newest.insert(d.summary.rank);
        newest_request = &*d.summary.answered;
      }
  const int asker = newest_request ? newest_request->origin_rank : trace::kUnknownRank;
  if (asker >= 0)
    for (const auto* list : {&dumps_, &history_})
      for (const auto& d : *list)
        if (d.summary.rank == asker && !d.summary.answered && d.summary.reason.Name() == newest_request->reason)
          answered_newest.insert(asker);
  std::vector<Dump> kept;
  kept.reserve(dumps_.size());
  for (auto& d : dumps_) {
    const bool older_round = d.summary.reason.Is(trace::DumpReason::PeerRequest) && d.summary.answered &&
                             d.summary.answered->request != newest->first && d.summary.time_unix_ns < newest->second &&
                             !answered_newest.count(d.summary.rank);
    if (!older_round) {
      kept.push_back(std::move(d));
      continue;
    }
    unanswered_ranks_[d.summary.rank] = {d.file_name, static_cast<double>(newest->second - d.summary.time_unix_ns) / 1e9};
    history_.push_back(std::move(d));
  }
  dumps_ = std::move(kept);
}

void DumpSet::MarkGoneBeforeTeardown() {
  // The teardown: most ranks ended with a dump of a SIGTERM (or SIGINT); those that did not
  // (a node lost with its ranks) may be gone.
  std::vector<int64_t> teardown;
  for (const auto& d : dumps_)
    if (d.last_reason == trace::DumpReasonName(trace::DumpReason::Signal)) teardown.push_back(d.last_time_unix_ns);
  if (teardown.size() < 2 || teardown.size() * 2 <= dumps_.size()) return;
  const int64_t began = *std::min_element(teardown.begin(), teardown.end());
  for (auto& d : dumps_) {
    const std::string& last = d.last_reason;
    using R = trace::DumpReason;
    // A process that said its own end (exit, crash, black box), or whose host said it is
    // stopped (it cannot answer a SIGTERM), is not silent.
    if (last == trace::DumpReasonName(R::Signal) || last == trace::DumpReasonName(R::Exit) ||
        last == trace::DumpReasonName(R::ExitInFlight) || last == trace::DumpReasonName(R::FatalSignal) ||
        last == trace::DumpReasonName(R::Postmortem) || last == trace::DumpReasonName(R::Stopped))
      continue;
    if (began - d.last_time_unix_ns < kGoneBeforeTeardownNs) continue;
    d.gone_before_teardown = true;
    d.gone_gap_s = (began - d.last_time_unix_ns) / 1'000'000'000;
  }
}

void DumpSet::IndexProcesses() {
  by_process_.clear();
  for (auto* list : {&dumps_, &history_})
    for (auto& d : *list) {
      by_process_[d.ProcessKey()].push_back(&d);
      // A recovery dump is light (its summary and the recovery list): read it whole, so that
      // a stall can be matched with its recovery.
      if (!d.summary.reason.Is(trace::DumpReason::Recovery) || !d.recoveries.empty()) continue;
      if (d.detail) {
        d.recoveries = d.detail->recoveries;
      } else if (d.OnDisk()) {
        Dump full;
        if (trace::ReadDumpFile(d.Path(), trace::ReadDepth::kFull, &full).usable && full.detail)
          d.recoveries = (d.share ? ShareOf(*d.share, full.detail) : full.detail)->recoveries;
      }
    }
  for (auto& [key, list] : by_process_)
    std::sort(list.begin(), list.end(),
              [](const Dump* a, const Dump* b) { return a->WriteOrder() < b->WriteOrder(); });
}

const std::vector<const Dump*>& DumpSet::DumpsOfProcess(const Dump& d) const {
  static const std::vector<const Dump*> kNone;
  auto it = by_process_.find(d.ProcessKey());
  return it == by_process_.end() ? kNone : it->second;
}

bool DumpSet::CompletedLater(const Dump& d, const trace::Op& op) const {
  for (const Dump* later : DumpsOfProcess(d)) {
    if (later->WriteOrder() > d.WriteOrder() && CompletedIn(*later, op)) return true;
  }
  return false;
}

bool DumpSet::StallRecovered(const Dump& d) const {
  if (!d.summary.reason.Is(trace::DumpReason::Stall)) return false;
  for (const Dump* later : DumpsOfProcess(d))
    if (later->WriteOrder() > d.WriteOrder() && StallEndedIn(d, *later)) return true;
  return false;
}

bool DumpSet::StallOver(const Dump& d) const {
  if (StallRecovered(d)) return true;
  if (!d.summary.reason.Is(trace::DumpReason::Stall) || !d.summary.stalled || d.summary.stalled->seq <= 0) return false;
  for (const auto* list : {&dumps_, &history_})
    for (const Dump& other : *list)
      if (CompletedIn(other, *d.summary.stalled)) return true;
  return false;
}

bool DumpSet::RequestFromRecoveredStall(const trace::AnsweredRequest& t) const {
  if (t.reason != trace::DumpReasonName(trace::DumpReason::Stall)) return false;
  size_t stalls = 0;
  for (const auto& [key, list] : by_process_) {
    if (list.empty() || list.front()->summary.host != t.origin_host) continue;
    for (const Dump* d : list) {
      if (d->summary.rank != t.origin_rank || !d->summary.reason.Is(trace::DumpReason::Stall)) continue;
      if (!StallRecovered(*d)) return false;
      ++stalls;
    }
  }
  return stalls > 0;  // the request's stall is not among the dumps: it may still be stuck
}

const trace::Recovery* DumpSet::RecoveryOf(const Dump& d, const std::string& comm, int64_t seq) const {
  for (const Dump* later : DumpsOfProcess(d)) {
    if (later->WriteOrder() <= d.WriteOrder()) continue;
    for (const auto& r : later->recoveries)
      if (r.comm == comm && r.seq == seq) return &r;
  }
  return nullptr;
}

namespace {

// Nothing happened in the process between dumps `a` and `b`: the same operations issued and
// completed on every communicator, the same NCCL calls in progress.
bool SameState(const Dump& a, const Dump& b) {
  const trace::Summary &x = a.summary, &y = b.summary;
  if (x.comms.size() != y.comms.size() || x.in_nccl.size() != y.in_nccl.size()) return false;
  for (const auto& c : y.comms) {
    const trace::CommSummary* o = x.Comm(c.id);
    if (!o || o->state != c.state || o->last_enqueued != c.last_enqueued || o->last_completed != c.last_completed)
      return false;
  }
  for (size_t i = 0; i < y.in_nccl.size(); ++i)
    if (x.in_nccl[i].tid != y.in_nccl[i].tid || x.in_nccl[i].function != y.in_nccl[i].function) return false;
  return true;
}

}  // namespace

std::vector<trace::PythonFrame> DumpSet::EarlierPythonFrames(const Dump& d, int64_t tid, std::string* file) {
  const auto& all = DumpsOfProcess(d);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const Dump* earlier = *it;
    if (earlier->WriteOrder() >= d.WriteOrder() || !earlier->OnDisk()) continue;
    if (!SameState(*earlier, d)) break;  // older ones are further from it still
    Dump full;
    trace::ReadResult r = trace::ReadDumpFile(earlier->Path(), trace::ReadDepth::kFull, &full);
    detail_bytes_read_ += r.bytes_read;
    const trace::Thread* t = r.usable && full.detail ? full.detail->FindThread(tid) : nullptr;
    if (t && !t->stack.python.empty()) {
      *file = earlier->file_name;
      return t->stack.python;
    }
  }
  return {};
}

const trace::Detail* DumpSet::JoinedDetail(size_t index) {
  const trace::Detail* base = Detail(index);
  if (!base) return nullptr;
  const Dump& evidence = dumps_[index];
  std::vector<const Dump*> all;  // the process's full dumps, in dump_seq order
  for (const Dump* d : DumpsOfProcess(evidence))
    if (d == &evidence || (d->OnDisk() && !d->summary.reason.Is(trace::DumpReason::Recovery))) all.push_back(d);
  if (all.size() < 2) return base;
  auto joined = std::make_shared<trace::Detail>(*base);
  // An operation is the same in every dump of its process: communicator, sequence numbers and
  // the moment it was enqueued. A later dump knows more of its state.
  using Key = std::tuple<std::string, int64_t, int64_t, int64_t>;
  std::map<Key, trace::Op> ops;
  std::map<int64_t, trace::Callsite> sites;
  for (const Dump* d : all) {
    std::shared_ptr<const trace::Detail> detail = d->detail;
    if (d != &evidence && !detail) {
      Dump full;
      trace::ReadResult r = trace::ReadDumpFile(d->Path(), trace::ReadDepth::kFull, &full);
      detail_bytes_read_ += r.bytes_read;
      if (!r.usable || !full.detail) continue;
      detail = d->share ? ShareOf(*d->share, full.detail) : full.detail;
    }
    if (d == &evidence) detail = nullptr;  // `base`, below
    const trace::Detail& det = detail ? *detail : *base;
    for (const auto& op : det.ring.entries) ops[Key{op.comm, op.seq, op.p2p_seq, op.enqueue_ns}] = op;
    for (const auto& c : det.callsites) sites.emplace(c.id, c);  // ids are the process's
  }
  joined->ring.entries.clear();
  for (auto& [key, op] : ops) joined->ring.entries.push_back(std::move(op));
  std::stable_sort(joined->ring.entries.begin(), joined->ring.entries.end(),
                   [](const trace::Op& a, const trace::Op& b) { return a.enqueue_ns < b.enqueue_ns; });
  joined->callsites.clear();
  for (auto& [id, c] : sites) joined->callsites.push_back(std::move(c));
  dumps_[index].detail = joined;
  return joined.get();
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
  if (!d.detail_problem.empty() || !d.OnDisk()) return nullptr;  // tried before, or in memory
  Dump full;
  trace::ReadResult r = trace::ReadDumpFile(d.Path(), trace::ReadDepth::kFull, &full);
  detail_bytes_read_ += r.bytes_read;
  ++details_read_;
  if (!r.usable || !full.detail) {
    d.detail_problem = r.problem.empty() ? "details unreadable" : r.problem;
    AddProblem(d.file_name, ProblemKind::kDetailsUnreadable, d.detail_problem);
    return nullptr;
  }
  if (!full.detail_problem.empty()) AddProblem(d.file_name, ProblemKind::kReader, full.detail_problem);
  d.detail = d.share ? ShareOf(*d.share, full.detail) : full.detail;
  return d.detail.get();
}


}  // namespace analysis
}  // namespace ncclwatch
