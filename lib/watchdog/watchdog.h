// The watchdog: one thread, started at the first NCCL operation, that follows every launched
// operation's GPU markers, moves its state forward (enqueued -> gpu_reached -> completed),
// and reports an operation that passes its deadline. A stall is a report, not a kill.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/mpmc_queue.h"
#include "gpu/markers.h"
#include "record/comm_registry.h"
#include "record/flight_ring.h"
#include "record/thread_registry.h"
#include "watchdog/deadlines.h"
#include "watchdog/setup_hangs.h"

namespace ncclwatch {

// Handed from the application thread to the watchdog when an operation was launched. It
// crosses cores once per operation, so it is small: where the operation's record is in the
// ring (the watchdog reads the rest from there), plus what a stall report needs should the
// ring overwrite that record before the watchdog drains the queue (a burst of more than
// NCCLWATCH_RING operations between two polls).
struct InflightItem {
  uint64_t index = 0;  // in the flight ring
  uint64_t stream = 0;
  uint64_t enqueue_ns = 0;
  uint64_t seq = 0;  // collective sequence number, or p2p_seq for send/recv
  uint64_t bytes = 0;
  CommInfo* comm = nullptr;
  Marker* marker = nullptr;
  int32_t peer_or_root = -1;
  trace::OpKind kind = trace::OpKind::AllReduce;
  bool captured = false;  // captured into a CUDA graph: followed at every replay

  static InflightItem Of(const OpSnapshot& op, CommInfo* comm, Marker* marker, bool captured = false) {
    const bool p2p = trace::IsPointToPoint(op.kind);
    InflightItem item;
    item.index = op.index;
    item.stream = op.stream;
    item.enqueue_ns = op.enqueue_ns;
    item.seq = p2p ? op.p2p_seq : op.seq;
    item.bytes = op.bytes;
    item.comm = comm;
    item.marker = marker;
    item.peer_or_root = p2p ? op.peer : op.root;
    item.kind = op.kind;
    item.captured = captured;
    return item;
  }
  // The operation as far as the item knows it, for when the ring no longer holds its record.
  OpSnapshot Fallback() const {
    const bool p2p = trace::IsPointToPoint(kind);
    OpSnapshot op;
    op.index = index;
    op.stream = stream;
    op.enqueue_ns = enqueue_ns;
    (p2p ? op.p2p_seq : op.seq) = seq;
    (p2p ? op.peer : op.root) = peer_or_root;
    op.bytes = bytes;
    op.kind = kind;
    op.comm_id = comm ? comm->id : 0;
    op.comm_size = comm ? comm->size : 0;
    op.comm_rank = comm ? comm->rank : -1;
    return op;
  }
};
static_assert(sizeof(InflightItem) <= 64, "the hand-off record stays within a cache line");

// An operation not yet completed, as a dump shows it.
struct InflightView {
  OpSnapshot op;
  double age_s = 0;       // since it became current on its stream
  double deadline_s = 0;
  bool stalled = false;
  bool host_blocked = false;  // the NCCL call itself has not returned
  // Captured into a CUDA graph and watched: in a replay now. `replays`: the replays the
  // watchdog has seen begin (a lower bound: replays that begin and end between two polls are
  // not seen), the current one included.
  bool captured = false;
  uint64_t replays = 0;
};

struct Recovery {
  uint64_t comm_id = 0;
  uint64_t seq = 0;
  trace::OpKind kind = trace::OpKind::AllReduce;
  double stalled_after_s = 0;
  double recovered_after_s = 0;
};

class Watchdog {
 public:
  struct Callbacks {
    std::function<void(const InflightView& stalled, const std::string& detail)> on_stall;
    std::function<void(const Recovery&)> on_recovery;
    std::function<void()> on_tick;  // after each poll, on the watchdog thread, no lock held
  };

  Watchdog(const Config& config, FlightRing* ring, GpuMarkers* markers, ThreadRegistry* threads,
           Callbacks callbacks);
  ~Watchdog();

  bool Start();
  // Asks the thread to stop and waits up to `timeout_ms`; detaches it if it does not stop
  // (stuck in the driver), never blocking exit for longer.
  void Stop(int timeout_ms);

  // Hot path: hands a launched operation over. False when the queue is full (the caller then
  // gives the marker back and the operation stays unmonitored).
  bool Submit(const InflightItem& item) {
    if (!queue_.TryPush(item)) return false;
    // A process's first operations each wake it (a futex wake at most; then one load per call):
    // a rank killed or stopped after a few quick calls leaves a box that says what its GPU
    // completed of them, not only that they were issued.
    if (eager_wakes_left_.load(std::memory_order_relaxed) > 0 &&
        eager_wakes_left_.fetch_sub(1, std::memory_order_relaxed) > 0) {
      Wake();
      return true;
    }
    // The watchdog paces its polls to the operation rate (PaceNs), so the application's thread
    // makes no system call in steady state. A burst the pace has not caught up with yet wakes
    // it from here (one futex wake per kWakeBacklog operations at most).
    if (queue_.ApproxSize() > kWakeBacklog && !wake_requested_.exchange(true, std::memory_order_acq_rel)) {
      submit_wakes_.fetch_add(1, std::memory_order_relaxed);
      Wake();
    }
    return true;
  }
  // How often Submit had to wake the watchdog (tests: pacing keeps this near zero).
  uint64_t submit_wakes() const { return submit_wakes_.load(std::memory_order_relaxed); }
  static constexpr size_t kQueueCapacity = 8192;
  static constexpr size_t kWakeBacklog = 1024;
  // At high operation rates the watchdog polls about every kPaceBatch operations, so markers
  // come back for reuse while still in cache; never more often than every kMinPaceNs.
  static constexpr size_t kPaceBatch = 256;
  static constexpr uint64_t kMinPaceNs = 100000;
  // The wait before the next poll, given that the last poll took `taken` operations off the
  // queue `elapsed_ns` after the one before: the poll interval at low rates, shorter at high.
  static uint64_t PaceNs(size_t taken, uint64_t elapsed_ns, uint64_t poll_ns);
  // A young process polls at least this often, for kYoungNs after the watchdog starts and after
  // the first operation it takes: one killed or stopped in its first moments still leaves a
  // black box whose op states say what its GPU completed (the first poll would otherwise come a
  // whole poll interval after its first calls; a quick job's first second is a few polls).
  static constexpr uint64_t kYoungPollNs = 10 * 1000000ull;
  static constexpr uint64_t kYoungNs = 2 * 1000000000ull;
  static constexpr int kEagerWakes = 256;  // the first operations that wake the watchdog
  // Async-signal-safe. A futex on a word of ours, not a descriptor: an application that closes
  // every descriptor and opens its own files could be handed a wake-up write otherwise.
  void Wake();

  // Dump side: operations not completed (launched ones, then ones whose NCCL call has not
  // returned). Waits at most `lock_timeout_ms` for the watchdog's state.
  // `now_ns` 0: the current time (tests pass their own clock).
  std::vector<InflightView> Inflight(int lock_timeout_ms, uint64_t now_ns = 0);
  // The same into `out` (cleared first; storage the caller keeps: the metrics' sample).
  void Inflight(int lock_timeout_ms, uint64_t now_ns, std::vector<InflightView>* out);
  std::vector<Recovery> Recoveries();
  // The communicators of the operations it follows (queued ones included); false when its
  // state could not be had within `lock_timeout_ms`.
  bool CommsInUse(int lock_timeout_ms, std::vector<const CommInfo*>* out);
  // Communicator creation calls in progress (application threads begin and end them), and the
  // first one past the default deadline not reported yet (watchdog thread, once per poll).
  SetupWatch& setups() { return setups_; }
  std::optional<SetupHang> CheckSetups(uint64_t now_ns) { return setups_.Check(now_ns, deadlines_.DefaultS()); }
    bool OnWatchdogThread() const { return std::this_thread::get_id() == thread_id_.load(); }
  bool running() const { return running_.load(std::memory_order_acquire); }
  // When the last poll looked at every operation it follows (0: none yet), and how many the
  // ring had recorded when it began: the states of those operations are as of then (the black
  // box says how fresh it is with them). Read on the watchdog thread, after a poll.
  uint64_t last_poll_ns() const { return last_poll_ns_.load(std::memory_order_acquire); }
  uint64_t last_poll_recorded() const { return last_poll_recorded_.load(std::memory_order_acquire); }

  // One poll step, exposed for unit tests (the thread calls it every poll interval). Returns
  // the number of operations it took off the queue.
  size_t PollOnce(uint64_t now_ns);

 private:
  struct Tracked {
    OpSnapshot op;  // read back from the ring when taken off the queue
    CommInfo* comm = nullptr;
    Marker* marker = nullptr;
    trace::OpState state = trace::OpState::Enqueued;
    uint64_t current_since_ns = 0;
    double deadline_s = 0;
    bool stall_reported = false;
  };
  // A stream's operations in launch order. Popped from the front, pushed at the back, into
  // storage it keeps: once it has held a stream's most operations at a time, following that
  // stream allocates nothing more (the watchdog's steady path never calls malloc, which may
  // crash out of memory: jemalloc does).
  class TrackedQueue {
   public:
    bool empty() const { return head_ == v_.size(); }
    size_t size() const { return v_.size() - head_; }
    Tracked& front() { return v_[head_]; }
    Tracked& operator[](size_t i) { return v_[head_ + i]; }
    Tracked* begin() { return v_.data() + head_; }
    Tracked* end() { return v_.data() + v_.size(); }
    // A push_back now would allocate (no room kept, none to move down into).
    bool full() const { return v_.size() == v_.capacity() && head_ == 0; }
    void pop_front() {
      if (++head_ == v_.size()) {
        v_.clear();
        head_ = 0;
      }
    }
    void push_back(const Tracked& t) {
      if (v_.size() == v_.capacity() && head_ > 0) {  // room at the front: moved down, not grown
        v_.erase(v_.begin(), v_.begin() + static_cast<std::ptrdiff_t>(head_));
        head_ = 0;
      }
      if (v_.capacity() == 0) v_.reserve(kStreamReserve);
      v_.push_back(t);
    }

   private:
    static constexpr size_t kStreamReserve = 64;
    std::vector<Tracked> v_;
    size_t head_ = 0;
  };
  struct StreamTrack {
    TrackedQueue items;
    uint64_t last_done_ns = 0;
  };
  // An operation captured into a CUDA graph, followed for as long as its communicator lives:
  // each replay records its external start and end events again. From the two queries:
  //   end reached                 -> kIdle (between replays, or never replayed yet)
  //   end pending, start reached  -> kStarted (inside the operation in a replay)
  //   end pending, start pending  -> kLaunched (a replay launched, the GPU not there yet)
  struct GraphTracked {
    enum class Phase : uint8_t { kIdle, kLaunched, kStarted };
    OpSnapshot op;  // as captured (the capture-time sequence number and call site)
    CommInfo* comm = nullptr;
    Marker* marker = nullptr;  // the graph's: never given back
    Phase phase = Phase::kIdle;
    uint64_t since_ns = 0;  // when the phase was first seen
    uint64_t replays = 0;   // replays seen begin
    double deadline_s = 0;
    bool stall_reported = false;
  };

  void Run();
  size_t Drain();
  void Advance(StreamTrack& track, uint64_t now_ns);
  void AdvanceGraphs(uint64_t now_ns);
  InflightView GraphViewOf(const GraphTracked& g, uint64_t now_ns) const;
  void Complete(Tracked& t, uint64_t now_ns);
  void CheckDeadlines(uint64_t now_ns, std::vector<std::pair<InflightView, std::string>>* stalls);
  void CheckHostBlocked(uint64_t now_ns, std::vector<std::pair<InflightView, std::string>>* stalls);
  InflightView ViewOf(const Tracked& t, uint64_t now_ns) const;

  const Config& config_;
  FlightRing* ring_;
  GpuMarkers* markers_;
  ThreadRegistry* threads_;
  Callbacks callbacks_;
  DeadlinePolicy deadlines_;
  SetupWatch setups_;
  MpmcQueue<InflightItem> queue_;

  std::mutex mu_;  // guards everything below; held by the watchdog during a poll
  std::map<uint64_t, StreamTrack> streams_;
  std::vector<GraphTracked> graphs_;  // captured operations (GpuMarkers::kMaxCapturedMarkers at most)
  std::vector<Recovery> recoveries_;
  std::map<std::pair<int32_t, uint64_t>, bool> host_stalls_reported_;  // (tid, since) -> reported
  std::vector<ThreadRegistry::InCall> inside_;  // each poll's calls in progress (capacity kept)
  bool outstanding_stall_ = false;

  pthread_t thread_{};
  bool started_ = false;  // thread_ was created (and not joined or detached by Stop)
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<bool> stop_{false};
  std::atomic<bool> wake_requested_{false};
  std::atomic<int> eager_wakes_left_{kEagerWakes};
  std::atomic<uint64_t> submit_wakes_{0};
  std::atomic<bool> running_{false};
  std::atomic<uint64_t> last_poll_ns_{0};
  std::atomic<uint64_t> last_poll_recorded_{0};
  std::atomic<uint32_t> wake_word_{0};  // 1: a wake is pending (futex word)
};

// A watchdog-thread duty (TickSchedule): ended communicators (destroyed, finalized, aborted)
// past timing::kEndedCommsKept are forgotten once no followed operation uses them; elastic jobs
// create thousands. Checked every timing::kEndedCommCheck.
uint64_t ForgetEndedComms(CommRegistry& comms, Watchdog& watchdog, uint64_t now);

}  // namespace ncclwatch
