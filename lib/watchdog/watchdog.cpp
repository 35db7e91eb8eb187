#include "watchdog/watchdog.h"

#include <pthread.h>
#include <signal.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "common/clock.h"
#include "common/memory_room.h"
#include "common/own_thread.h"
#include "common/lock_within.h"
#include "format/display.h"
#include "common/log.h"
#include "common/quietly.h"
#include "common/timing.h"

namespace ncclwatch {
namespace {

std::string DescribeStall(const InflightView& v, const char* where) {
  char buf[512];
  const OpSnapshot& o = v.op;
  std::string id = CommIdHex(o.comm_id);
  if (v.captured && o.seq > 0)
    snprintf(buf, sizeof buf,
             "%s seq %llu (captured in a CUDA graph) on comm %s (%s), replays seen %llu: %s for %.1f s; deadline %.1f s",
             trace::OpKindName(o.kind), static_cast<unsigned long long>(o.seq), id.c_str(),
             trace::FormatBytes(o.bytes).c_str(), static_cast<unsigned long long>(v.replays), where, v.age_s,
             v.deadline_s);
  else if (v.captured)
    snprintf(buf, sizeof buf,
             "%s #%llu %s peer %d (captured in a CUDA graph) on comm %s (%s), replays seen %llu: %s for %.1f s; deadline %.1f s",
             trace::OpKindName(o.kind), static_cast<unsigned long long>(o.p2p_seq),
             o.kind == trace::OpKind::Send ? "to" : "from", o.peer, id.c_str(), trace::FormatBytes(o.bytes).c_str(),
             static_cast<unsigned long long>(v.replays), where, v.age_s, v.deadline_s);
  else if (o.seq > 0)
    snprintf(buf, sizeof buf, "%s seq %llu on comm %s (%s) %s for %.1f s; deadline %.1f s",
             trace::OpKindName(o.kind), static_cast<unsigned long long>(o.seq), id.c_str(),
             trace::FormatBytes(o.bytes).c_str(), where, v.age_s, v.deadline_s);
  else
    snprintf(buf, sizeof buf, "%s #%llu %s peer %d on comm %s (%s) %s for %.1f s; deadline %.1f s",
             trace::OpKindName(o.kind), static_cast<unsigned long long>(o.p2p_seq),
             o.kind == trace::OpKind::Send ? "to" : "from", o.peer, id.c_str(),
             trace::FormatBytes(o.bytes).c_str(), where, v.age_s, v.deadline_s);
  return buf;
}

}  // namespace

Watchdog::Watchdog(const Config& config, FlightRing* ring, GpuMarkers* markers, ThreadRegistry* threads,
                   Callbacks callbacks)
    : config_(config),
      ring_(ring),
      markers_(markers),
      threads_(threads),
      callbacks_(std::move(callbacks)),
      deadlines_(config.timeout, config.adaptive, config.adaptive_floor_s, config.adaptive_min_samples),
      queue_(kQueueCapacity) {
  inside_.reserve(ThreadRegistry::kCapacity);
}

Watchdog::~Watchdog() {
  if (started_) {
    pthread_detach(thread_);  // never joined: the runtime's watchdog lives until the process exits
    return;
  }
  // A watchdog that never ran a thread (tests): hand its markers back to their pools.
  Drain();
  for (auto& kv : streams_)
    for (auto& t : kv.second.items)
      if (markers_) markers_->Release(t.marker);
}

bool Watchdog::Start() {
  // The thread starts with every asynchronous signal blocked: SIGTERM/SIGINT/the dump signal
  // must be handled by application threads, whose handlers ask this thread to dump. The faults
  // stay unblocked (OwnThreadMask says why), and SIGABRT (abort() in this thread).
  running_.store(true, std::memory_order_release);
  auto main = [](void* self) -> void* {
    static_cast<Watchdog*>(self)->Run();
    return nullptr;
  };
  started_ = StartOwnThread(&thread_, main, this, SIGABRT, /*detached=*/false) == 0;
  if (!started_) running_.store(false);
  return running_.load();
}

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "the wake word is a plain futex word");

void Watchdog::Wake() {
  // Only the first wake since the watchdog last looked makes a system call.
  if (wake_word_.exchange(1, std::memory_order_acq_rel) == 0)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_word_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

void Watchdog::Stop(int timeout_ms) {
  if (!started_) return;
  stop_.store(true, std::memory_order_release);
  Wake();
  for (int waited = 0; running_.load(std::memory_order_acquire) && waited < timeout_ms; waited += 5)
    usleep(5000);
  if (running_.load(std::memory_order_acquire))
    pthread_detach(thread_);  // stuck in the driver: never hold up the process
  else
    pthread_join(thread_, nullptr);
  started_ = false;
}

void Watchdog::Run() {
  bool warm = WarmAllocator();  // started out of memory: nothing runs until it is done
  thread_id_.store(std::this_thread::get_id());
  pthread_setname_np(pthread_self(), "ncclwatch");
  if (markers_) markers_->PrepareThread();
  const uint64_t poll_ns = config_.poll_ms * 1000000;
  const uint64_t started_ns = MonoNs();
  uint64_t first_op_ns = 0;  // when a poll first took an operation (0: none yet)
  auto young = [&](uint64_t now) {
    return now - started_ns < kYoungNs || (first_op_ns != 0 && now - first_op_ns < kYoungNs);
  };
  uint64_t wait_ns = std::min(poll_ns, kYoungPollNs), last_ns = started_ns;
  while (!stop_.load(std::memory_order_acquire)) {
    // Sleeps until the wait is over or Wake() (a wake since the last look returns at once).
    timespec wait{static_cast<time_t>(wait_ns / 1000000000), static_cast<long>(wait_ns % 1000000000)};
    // The poll below serves every wake that came before it.
    if (wake_word_.exchange(0, std::memory_order_acq_rel) == 0) {
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&wake_word_), FUTEX_WAIT_PRIVATE, 0, &wait, nullptr, 0);
      wake_word_.store(0, std::memory_order_release);
    }
    if (stop_.load(std::memory_order_acquire)) break;
    if (!warm && !(warm = WarmAllocator())) continue;  // the queue waits (full: unmonitored)
    const uint64_t now = MonoNs();
    size_t taken = 0;
    // Out of memory here ends this round only: the thread, and the process, go on.
    Quietly("the watchdog", [&] { taken = PollOnce(now); });
    if (taken != 0 && first_op_ns == 0) first_op_ns = now;
    wait_ns = PaceNs(taken, now - last_ns, poll_ns);
    if (young(now)) wait_ns = std::min(wait_ns, kYoungPollNs);
    last_ns = now;
    if (callbacks_.on_tick) Quietly("the watchdog", [&] { callbacks_.on_tick(); });
  }
  running_.store(false, std::memory_order_release);
}

uint64_t Watchdog::PaceNs(size_t taken, uint64_t elapsed_ns, uint64_t poll_ns) {
  if (taken == 0) return poll_ns;
  // elapsed / taken is the time per operation: wait for about kPaceBatch more. A quiet job
  // comes out far above the poll interval, so it keeps one wake-up per interval.
  const double pace = static_cast<double>(elapsed_ns) * kPaceBatch / static_cast<double>(taken);
  if (pace >= static_cast<double>(poll_ns)) return poll_ns;
  return std::max(kMinPaceNs, static_cast<uint64_t>(pace));
}

size_t Watchdog::Drain() {
  wake_requested_.store(false, std::memory_order_release);
  InflightItem item;
  size_t taken = 0;
  while (queue_.TryPop(&item)) {
    // A new stream, or one past the most operations it held, takes storage: out of address space
    // (where jemalloc may crash) the operation goes unfollowed, its marker back to the pool.
    if (item.captured) {
      if (graphs_.size() == graphs_.capacity() && !AddressSpaceRoom()) {
        ++taken;  // unwatched (its marker stays the graph's)
        continue;
      }
      GraphTracked g;
      if (!ring_->Read(item.index, &g.op)) g.op = item.Fallback();
      g.comm = item.comm;
      g.marker = item.marker;
      graphs_.push_back(g);
      LogInfo("watching %s seq %llu, captured into a CUDA graph, at every replay", trace::OpKindName(g.op.kind),
              static_cast<unsigned long long>(g.op.seq));
      ++taken;
      continue;
    }
    auto it = streams_.find(item.stream);
    if ((it == streams_.end() || it->second.items.full()) && !AddressSpaceRoom()) {
      if (markers_) markers_->Release(item.marker);
      ++taken;
      continue;
    }
    if (it == streams_.end()) it = streams_.emplace(item.stream, StreamTrack{}).first;
    Tracked t;
    if (!ring_->Read(item.index, &t.op)) t.op = item.Fallback();  // overwritten in a burst
    t.comm = item.comm;
    t.marker = item.marker;
    it->second.items.push_back(t);
    ++taken;
  }
  return taken;
}

size_t Watchdog::PollOnce(uint64_t now_ns) {
  std::vector<std::pair<InflightView, std::string>> stalls;
  std::vector<Recovery> recovered;
  size_t taken;
  // Every operation recorded before this is drained now, or its call has not returned yet.
  const uint64_t recorded = ring_->recorded();
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t before = recoveries_.size();
    taken = Drain();
    for (auto it = streams_.begin(); it != streams_.end();) {
      Advance(it->second, now_ns);
      // Forget idle streams, but keep the last completion time while work may follow soon.
      if (it->second.items.empty() && ElapsedS(it->second.last_done_ns, now_ns) > timing::S(timing::kIdleStreamForget))
        it = streams_.erase(it);
      else
        ++it;
    }
    AdvanceGraphs(now_ns);
    CheckDeadlines(now_ns, &stalls);
    CheckHostBlocked(now_ns, &stalls);
    recovered.assign(recoveries_.begin() + before, recoveries_.end());
  }
  last_poll_recorded_.store(recorded, std::memory_order_relaxed);
  last_poll_ns_.store(now_ns, std::memory_order_release);
  // Callbacks write dumps, which read our state: never call them with the lock held.
  for (auto& r : recovered)
    if (callbacks_.on_recovery) callbacks_.on_recovery(r);
  for (auto& s : stalls)
    if (callbacks_.on_stall) callbacks_.on_stall(s.first, s.second);
  return taken;
}

void Watchdog::Advance(StreamTrack& track, uint64_t now_ns) {
  auto& items = track.items;
  // A stream runs its work in order, so its completed operations are a prefix of `items`: a
  // binary search over end markers finds it with O(log n) queries, not one per operation (at
  // hundreds of thousands of operations a second, per-operation queries would cost a core).
  size_t lo = 0, hi = items.size();
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (markers_->QueryEnd(items[mid].marker) == CUDA_SUCCESS)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (size_t done = 0; done < lo; ++done) {
    Tracked& t = items.front();
    if (t.current_since_ns == 0) t.current_since_ns = std::max(t.op.enqueue_ns, track.last_done_ns);
    Complete(t, now_ns);
    track.last_done_ns = now_ns;
    items.pop_front();
  }
  while (!items.empty()) {
    Tracked& t = items.front();
    // An operation's clock starts when it becomes current on its stream: the ones queued
    // behind it cannot start earlier.
    if (t.current_since_ns == 0) t.current_since_ns = std::max(t.op.enqueue_ns, track.last_done_ns);
    CUresult r = markers_->QueryEnd(t.marker);
    if (r == CUDA_SUCCESS) {  // completed since the search
      Complete(t, now_ns);
      track.last_done_ns = now_ns;
      items.pop_front();
      continue;
    }
    if (r != CUDA_ERROR_NOT_READY) {
      LogWarn("CUDA error %d while following %s on stream 0x%llx; no longer following it", static_cast<int>(r),
              trace::OpKindName(t.op.kind), static_cast<unsigned long long>(t.op.stream));
      ring_->SetState(t.op.index, trace::OpState::Error, now_ns);
      markers_->Release(t.marker);
      items.pop_front();
      continue;
    }
    if (t.state == trace::OpState::Enqueued && markers_->QueryStart(t.marker) == CUDA_SUCCESS) {
      t.state = trace::OpState::GpuReached;
      ring_->SetState(t.op.index, trace::OpState::GpuReached, now_ns);
      t.op.gpu_reached_ns = now_ns;
      if (t.op.seq > 0 && t.comm) StoreMax(t.comm->live().last_gpu_reached, t.op.seq);
    }
    break;
  }
}

void Watchdog::Complete(Tracked& t, uint64_t now_ns) {
  const OpSnapshot& o = t.op;
  // Its communicator was aborted before this poll saw the end marker: the abort ended it (its
  // GPU work returns after an ncclCommAbort), it did not complete. Nothing is learned from it:
  // no completion count, no healthy duration, no recovery.
  if (t.comm && t.comm->live().state.load(std::memory_order_acquire) == CommState::Aborted) {
    ring_->SetState(o.index, trace::OpState::Aborted, now_ns);
    markers_->Release(t.marker);
    return;
  }
  ring_->SetState(o.index, trace::OpState::Completed, now_ns);
  if (markers_->timing()) ring_->SetGpuMs(o.index, markers_->ElapsedMs(t.marker));
  if (CommInfo* c = t.comm) {
    if (o.seq > 0) {
      StoreMax(c->live().last_gpu_reached, o.seq);
      StoreMax(c->live().last_completed, o.seq);
    } else if (PeerCounters* p = c->Peer(o.peer)) {
      StoreMax(o.kind == trace::OpKind::Send ? p->send_completed : p->recv_completed, o.p2p_seq);
    }
  }
  double took = ElapsedS(t.current_since_ns, now_ns);
  if (!t.stall_reported) {
    deadlines_.RecordHealthy(o.comm_id, o.kind, o.bytes, took);
  } else {
    Recovery r;
    r.comm_id = o.comm_id;
    r.seq = o.seq;
    r.kind = o.kind;
    r.stalled_after_s = t.deadline_s;
    r.recovered_after_s = took;
    recoveries_.push_back(r);
  }
  markers_->Release(t.marker);
}

void Watchdog::AdvanceGraphs(uint64_t now_ns) {
  using Phase = GraphTracked::Phase;
  size_t kept = 0;
  for (size_t i = 0; i < graphs_.size(); ++i) {
    GraphTracked& g = graphs_[i];
    // Its communicator ended: no replay can run it any more (the marker stays the graph's).
    const bool ended = g.comm && g.comm->live().state.load(std::memory_order_acquire) != CommState::Active;
    const CUresult end = ended ? CUDA_ERROR_INVALID_HANDLE : markers_->QueryEnd(g.marker);
    const CUresult start = end == CUDA_ERROR_NOT_READY ? markers_->QueryStart(g.marker) : CUDA_SUCCESS;
    if ((end != CUDA_SUCCESS && end != CUDA_ERROR_NOT_READY) || (start != CUDA_SUCCESS && start != CUDA_ERROR_NOT_READY)) {
      if (!ended)
        LogInfo("CUDA error %d while following captured %s seq %llu; no longer following it",
                static_cast<int>(end != CUDA_SUCCESS && end != CUDA_ERROR_NOT_READY ? end : start),
                trace::OpKindName(g.op.kind), static_cast<unsigned long long>(g.op.seq));
      continue;  // dropped
    }
    const Phase now_phase = end == CUDA_SUCCESS ? Phase::kIdle : start == CUDA_SUCCESS ? Phase::kStarted : Phase::kLaunched;
    if (now_phase != g.phase) {
      // A replay begins: from idle, or a start pending again after it was reached (the next
      // launch recorded it anew).
      if (g.phase == Phase::kIdle || (g.phase == Phase::kStarted && now_phase == Phase::kLaunched)) ++g.replays;
      if (g.stall_reported && now_phase != Phase::kStarted) {
        Recovery r;
        r.comm_id = g.op.comm_id;
        r.seq = g.op.seq;
        r.kind = g.op.kind;
        r.stalled_after_s = g.deadline_s;
        r.recovered_after_s = ElapsedS(g.since_ns, now_ns);
        recoveries_.push_back(r);
        g.stall_reported = false;
      }
      g.phase = now_phase;
      g.since_ns = now_ns;
    }
    if (kept != i) graphs_[kept] = g;
    ++kept;
  }
  graphs_.resize(kept);
}

InflightView Watchdog::GraphViewOf(const GraphTracked& g, uint64_t now_ns) const {
  InflightView v;
  v.op = g.op;
  v.op.state = g.phase == GraphTracked::Phase::kStarted ? trace::OpState::GpuReached : trace::OpState::Enqueued;
  v.age_s = ElapsedS(g.since_ns, now_ns);
  v.deadline_s = g.deadline_s > 0 ? g.deadline_s : deadlines_.DeadlineS(g.op.comm_id, g.op.kind, g.op.bytes);
  v.stalled = g.stall_reported;
  v.captured = true;
  v.replays = g.replays;
  return v;
}

InflightView Watchdog::ViewOf(const Tracked& t, uint64_t now_ns) const {
  InflightView v;
  v.op = t.op;
  v.op.state = t.state;
  uint64_t since = t.current_since_ns ? t.current_since_ns : t.op.enqueue_ns;
  v.age_s = ElapsedS(since, now_ns);
  v.deadline_s = t.deadline_s > 0 ? t.deadline_s
                                   : deadlines_.DeadlineS(t.op.comm_id, t.op.kind, t.op.bytes);
  v.stalled = t.stall_reported;
  return v;
}

void Watchdog::CheckDeadlines(uint64_t now_ns, std::vector<std::pair<InflightView, std::string>>* stalls) {
  bool outstanding = false;
  for (auto& kv : streams_)
    for (auto& t : kv.second.items) outstanding = outstanding || t.stall_reported;
  for (auto& g : graphs_) outstanding = outstanding || g.stall_reported;
  // A captured operation whose start was recorded in a replay and whose end was not, for longer
  // than its deadline. One launched but not reached is not a stall of its own (the host may run
  // replays ahead of the GPU): peers' stalls make this rank dump, and the dump shows it.
  for (auto& g : graphs_) {
    if (g.phase != GraphTracked::Phase::kStarted) continue;
    g.deadline_s = deadlines_.DeadlineS(g.op.comm_id, g.op.kind, g.op.bytes);
    if (g.stall_reported || ElapsedS(g.since_ns, now_ns) <= g.deadline_s) continue;
    g.stall_reported = true;
    InflightView v = GraphViewOf(g, now_ns);
    std::string detail = DescribeStall(v, "reached by the GPU but not completed");
    if (outstanding)
      LogInfo("also late: %s", detail.c_str());
    else
      stalls->emplace_back(v, detail);
    outstanding = true;
  }
  for (auto& kv : streams_) {
    if (kv.second.items.empty()) continue;
    Tracked& t = kv.second.items.front();  // only the current operation of a stream can be late
    t.deadline_s = deadlines_.DeadlineS(t.op.comm_id, t.op.kind, t.op.bytes);
    double age = ElapsedS(t.current_since_ns, now_ns);
    if (t.stall_reported || age <= t.deadline_s) continue;
    t.stall_reported = true;
    InflightView v = ViewOf(t, now_ns);
    const char* where = t.state == trace::OpState::Enqueued
                            ? "launched but not reached by the GPU"
                            : "reached by the GPU but not completed";
    std::string detail = DescribeStall(v, where);
    // One dump per episode: further late operations while one is outstanding are consequences.
    if (outstanding)
      LogInfo("also late: %s", detail.c_str());
    else
      stalls->emplace_back(v, detail);
    outstanding = true;
  }
  outstanding_stall_ = outstanding;
}

void Watchdog::CheckHostBlocked(uint64_t now_ns, std::vector<std::pair<InflightView, std::string>>* stalls) {
  // Nothing is allocated unless a call is late (a stall: a dump follows).
  std::map<std::pair<int32_t, uint64_t>, bool> still;
  threads_->InsideNccl(&inside_);
  for (auto& call : inside_) {
    if (call.creating) continue;  // a setup hang (CheckSetups), naming the communicator
    auto key = std::make_pair(call.tid, call.since_ns);
    bool reported = host_stalls_reported_.count(key) > 0;
    InflightView v;
    v.host_blocked = true;
    v.age_s = ElapsedS(call.since_ns, now_ns);
    bool has_op = call.op_index1 != 0 && ring_->Read(call.op_index1 - 1, &v.op);
    v.deadline_s = has_op ? deadlines_.DeadlineS(v.op.comm_id, v.op.kind, v.op.bytes) : deadlines_.DefaultS();
    if (reported || v.age_s > v.deadline_s) still[key] = true;  // a stall's (allocates)
    if (reported || v.age_s <= v.deadline_s) continue;
    v.stalled = true;
    char where[160];
    snprintf(where, sizeof where, "blocked on the host inside %s (thread %d)", call.function, call.tid);
    std::string detail = has_op ? DescribeStall(v, where)
                                : std::string("thread ") + std::to_string(call.tid) + " blocked inside " +
                                      call.function + " for " + std::to_string(static_cast<int>(v.age_s)) +
                                      " s; deadline " + std::to_string(static_cast<int>(v.deadline_s)) + " s";
    if (!has_op) v.op = OpSnapshot{};
    if (outstanding_stall_)
      LogInfo("also late: %s", detail.c_str());
    else
      stalls->emplace_back(v, detail);
    outstanding_stall_ = true;
  }
  if (!still.empty() || !host_stalls_reported_.empty()) host_stalls_reported_.swap(still);
}

std::vector<InflightView> Watchdog::Inflight(int lock_timeout_ms, uint64_t now_ns) {
  std::vector<InflightView> out;
  Inflight(lock_timeout_ms, now_ns, &out);
  return out;
}

void Watchdog::Inflight(int lock_timeout_ms, uint64_t now_ns, std::vector<InflightView>* out_ptr) {
  std::vector<InflightView>& out = *out_ptr;
  out.clear();
  uint64_t now = now_ns ? now_ns : MonoNs();
  // Callers on the watchdog thread are callbacks: PollOnce has released the lock by then.
  bool locked = LockWithin(mu_, lock_timeout_ms);
  std::unique_lock<std::mutex> lock(mu_, std::adopt_lock_t{});
  if (!locked) lock.release();
  if (locked) {
    Drain();
    for (auto& kv : streams_)
      for (auto& t : kv.second.items) out.push_back(ViewOf(t, now));
    for (auto& g : graphs_)
      if (g.phase != GraphTracked::Phase::kIdle) out.push_back(GraphViewOf(g, now));
  }
  // Operations whose NCCL call has not returned yet (not handed to us so far); with the lock,
  // into the watchdog's kept vector.
  std::vector<ThreadRegistry::InCall> own;
  std::vector<ThreadRegistry::InCall>& calls = locked ? inside_ : own;
  threads_->InsideNccl(&calls);
  for (auto& call : calls) {
    InflightView v;
    if (call.op_index1 == 0 || !ring_->Read(call.op_index1 - 1, &v.op)) continue;
    v.host_blocked = true;
    v.age_s = ElapsedS(call.since_ns, now);
    v.deadline_s = locked ? deadlines_.DeadlineS(v.op.comm_id, v.op.kind, v.op.bytes) : deadlines_.DefaultS();
    v.stalled = v.age_s > v.deadline_s;
    out.push_back(v);
  }
  std::sort(out.begin(), out.end(),
            [](const InflightView& a, const InflightView& b) { return a.op.index < b.op.index; });
}

bool Watchdog::CommsInUse(int lock_timeout_ms, std::vector<const CommInfo*>* out) {
  if (!LockWithin(mu_, lock_timeout_ms)) return false;
  std::lock_guard<std::mutex> lock(mu_, std::adopt_lock);
  Drain();
  for (auto& kv : streams_)
    for (auto& t : kv.second.items) out->push_back(t.comm);
  for (auto& g : graphs_) out->push_back(g.comm);
  return true;
}

std::vector<Recovery> Watchdog::Recoveries() {
  if (!LockWithin(mu_, timing::Ms(timing::kRecoveriesLockWait))) return {};
  std::lock_guard<std::mutex> lock(mu_, std::adopt_lock);
  return recoveries_;
}

uint64_t ForgetEndedComms(CommRegistry& comms, Watchdog& watchdog, uint64_t now) {
  const uint64_t next = now + timing::Ns(timing::kEndedCommCheck);
  if (comms.EndedCount() <= timing::kEndedCommsKept) return next;
  std::vector<const CommInfo*> in_use;
  if (!watchdog.CommsInUse(timing::Ms(timing::kInflightLockWait), &in_use)) return next;
  const uint64_t forget = timing::Ns(timing::kEndedCommForget);
  if (size_t n = comms.ForgetEnded(timing::kEndedCommsKept, now > forget ? now - forget : 0, in_use))
    LogDebug("forgot %zu ended communicators (the newest %zu are kept)", n, timing::kEndedCommsKept);
  return next;
}

}  // namespace ncclwatch
