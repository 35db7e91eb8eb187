#include "render/timeline.h"

#include <algorithm>
#include <map>

#include "format/json_writer.h"
#include "ncclwatch/version.h"

namespace ncclwatch {
namespace analysis {

namespace {

using trace::JsonWriter;

// Trace-event process id of a dump: its rank (unknown ranks after every real one).
int64_t Pid(const Dump& d, size_t index) { return d.summary.rank >= 0 ? d.summary.rank : 10000000 + static_cast<int64_t>(index); }

class EventWriter {
 public:
  EventWriter(const std::function<void(const std::string&)>& write) : write_(write), w_(&buf_) {}

  JsonWriter& Begin(const char* ph, const std::string& name, int64_t pid, int64_t tid) {
    if (events_++) buf_ += ",\n";
    w_.BeginObject();
    w_.Field("ph", ph);
    w_.Field("name", name);
    w_.Field("pid", pid);
    w_.Field("tid", tid);
    return w_;
  }
  void End() {
    w_.EndObject();
    if (buf_.size() > 64 * 1024) Flush();
  }
  void Metadata(const char* what, int64_t pid, int64_t tid, const std::string& name) {
    Begin("M", what, pid, tid).Key("args").BeginObject();
    w_.Field("name", name);
    w_.EndObject();
    End();
  }
  void SortIndex(int64_t pid, int64_t index) {
    Begin("M", "process_sort_index", pid, 0).Key("args").BeginObject();
    w_.Field("sort_index", index);
    w_.EndObject();
    End();
  }
  // An instant: "t" thread scope, "p" process scope.
  JsonWriter& Instant(const std::string& name, int64_t pid, int64_t tid, double ts_us, const char* scope) {
    JsonWriter& w = Begin("i", name, pid, tid);
    w.Field("ts", ts_us);
    w.Field("s", scope);
    return w;
  }
  void Flush() {
    write_(buf_);
    buf_.clear();
  }
  size_t events() const { return events_; }
  JsonWriter& w() { return w_; }

 private:
  const std::function<void(const std::string&)>& write_;
  std::string buf_;
  JsonWriter w_;
  size_t events_ = 0;
};

}  // namespace

TimelineStats WriteTimeline(DumpSet& set, const std::vector<RankTimes>& times, const ClockAlignment& clocks,
                            const std::function<void(const std::string&)>& write) {
  TimelineStats stats;
  // Time 0 of the trace: the earliest operation on the aligned clock.
  int64_t origin = 0;
  bool have_origin = false;
  for (const auto& r : times)
    if (r.earliest_ns > 0) {
      int64_t t = clocks.Align(r.host, r.earliest_ns);
      if (!have_origin || t < origin) origin = t;
      have_origin = true;
    }
  auto us = [&](const std::string& host, int64_t mono_ns) {
    return static_cast<double>(clocks.Align(host, mono_ns) - origin) / 1000.0;
  };

  write("{\"displayTimeUnit\":\"ms\",\"otherData\":");
  {
    std::string meta;
    JsonWriter m(&meta);
    m.BeginObject();
    m.Field("generator", std::string("ncclwatch timeline ") + kNcclwatchVersion);
    m.Field("attempt", set.chosen_attempt());
    m.Field("ranks", static_cast<int64_t>(set.dumps().size()));
    m.Field("clock", "each host's monotonic clock moved onto " + clocks.reference_host +
                         "'s; time 0 is the earliest operation");
    m.Field("clock_reference_host", clocks.reference_host);
    m.Key("clock_offsets").BeginObject();
    for (const auto& [host, c] : clocks.hosts) {
      m.Key(host).BeginObject();
      m.Field("offset_ns", c.offset_ns);
      m.Field("spread_ns", c.spread_ns);
      m.Field("samples", static_cast<int64_t>(c.samples));
      m.Field("method", c.method);
      m.Field("via", c.via);
      m.EndObject();
    }
    m.EndObject();
    m.EndObject();
    write(meta);
  }
  write(",\"traceEvents\":[\n");
  EventWriter ev(write);
  std::multimap<int, const Dump*> history_by_rank;
  for (const auto& h : set.history()) history_by_rank.emplace(h.summary.rank, &h);

  for (size_t i = 0; i < set.dumps().size(); ++i) {
    const Dump& d = set.dumps()[i];
    const std::string& host = d.summary.host;
    const int64_t pid = Pid(d, i);
    ev.Metadata("process_name", pid, 0,
                (d.summary.rank >= 0 ? "rank " + std::to_string(d.summary.rank) : "rank ?") + " (" + host + ", pid " +
                    std::to_string(d.summary.pid) + ")");
    ev.SortIndex(pid, pid);
    ++stats.ranks;
    const trace::Detail* detail = set.JoinedDetail(i);
    // Tracks: one per communicator and stream, in order of first use.
    std::map<std::string, int64_t> track_of;
    std::map<std::string, std::string> comm_name;
    for (const auto& c : d.summary.comms) comm_name[c.id] = c.name;
    auto track = [&](const trace::Op& op) {
      std::string key = op.comm + " " + op.stream;
      auto it = track_of.find(key);
      if (it != track_of.end()) return it->second;
      int64_t tid = static_cast<int64_t>(track_of.size()) + 1;
      track_of.emplace(key, tid);
      std::string name = "comm " + op.comm.substr(0, 8);
      if (!comm_name[op.comm].empty()) name += " (" + comm_name[op.comm] + ")";
      ev.Metadata("thread_name", pid, tid, name + ", stream " + op.stream);
      return tid;
    };
    if (detail) {
      // A stream runs its work in order, and the host usually enqueues ahead of it: a slice
      // starts at the later of the operation's enqueue and the end of the one before it on its
      // stream, as the watchdog's clock does, so that slices on a track never overlap (the
      // viewers need slices on a track to nest). Completion times are when the watchdog saw
      // them (NCCLWATCH_POLL_MS). An operation whose end is never known (captured into a CUDA
      // graph, not followed on the GPU, failed) is a mark at its enqueue.
      std::map<std::string, int64_t> stream_free_ns;
      for (const auto& op : detail->ring.entries) {
        if (op.enqueue_ns <= 0) continue;
        int64_t tid = track(op);
        const int64_t seq = op.IsP2p() ? op.p2p_seq : op.seq;
        const trace::OpState state = op.state.known ? op.state.value : trace::OpState::Completed;
        const bool done = op.completed_ns > 0 && state == trace::OpState::Completed;
        const bool running = op.completed_ns <= 0 && (state == trace::OpState::PendingLaunch ||
                                                      state == trace::OpState::Enqueued ||
                                                      state == trace::OpState::GpuReached);
        const bool slice = done || running;
        int64_t& free_ns = stream_free_ns[op.stream];
        const int64_t start = slice ? std::max(op.enqueue_ns, free_ns) : op.enqueue_ns;
        const int64_t end = std::max(start, done ? op.completed_ns : d.summary.time_mono_ns);
        if (slice) free_ns = end;
        JsonWriter& w = ev.Begin(slice ? "X" : "i", op.OpName(), pid, tid);
        w.Field("cat", op.IsP2p() ? "nccl,p2p" : "nccl");
        w.Field("ts", us(host, start));
        if (slice)
          w.Field("dur", static_cast<double>(end - start) / 1000.0);
        else
          w.Field("s", "t");
        w.Key("args").BeginObject();
        w.Field("seq", seq);
        if (op.IsP2p()) w.Field("peer", op.peer);
        w.Field("op", op.OpName());
        w.Field("bytes", op.bytes);
        w.Field("count", op.count);
        w.Field("dtype", op.dtype);
        if (!op.redop.empty()) w.Field("redop", op.redop);
        w.Field("comm", op.comm);
        w.Field("state", op.state.known ? trace::OpStateName(op.state.value) : "unknown");
        if (start > op.enqueue_ns) w.Field("queued_ms", static_cast<double>(start - op.enqueue_ns) / 1e6);
        if (running) w.Field("until", "the dump (not completed)");
        if (op.callsite >= 0) w.Field("callsite", op.callsite);
        if (op.gpu_ms >= 0) w.Field("gpu_ms", op.gpu_ms);
        w.EndObject();
        ev.End();
        if (op.gpu_reached_ns > 0) {
          JsonWriter& g = ev.Instant("gpu_reached", pid, tid, us(host, op.gpu_reached_ns), "t");
          g.Key("args").BeginObject();
          g.Field("seq", seq);
          g.EndObject();
          ev.End();
        }
      }
      for (const auto& r : detail->recoveries) {
        for (const auto& op : detail->ring.entries) {
          if (op.comm != r.comm || op.seq != r.seq || op.enqueue_ns <= 0) continue;
          JsonWriter& w = ev.Instant("recovered: " + r.op + " seq " + std::to_string(r.seq), pid, track(op),
                                     us(host, op.enqueue_ns + static_cast<int64_t>(r.recovered_after_s * 1e9)), "t");
          w.Key("args").BeginObject();
          w.Field("stalled_after_s", r.stalled_after_s);
          w.Field("recovered_after_s", r.recovered_after_s);
          w.EndObject();
          ev.End();
          break;
        }
      }
    }
    set.DropDetail(i);
    // This rank's dumps (earlier ones of the same process first), and the stall it reported.
    std::vector<const Dump*> dumps;
    auto range = history_by_rank.equal_range(d.summary.rank);
    for (auto it = range.first; it != range.second; ++it)
      if (it->second->summary.host == host && it->second->summary.pid == d.summary.pid) dumps.push_back(it->second);
    dumps.push_back(&d);
    for (const Dump* x : dumps) {
      const trace::Summary& s = x->summary;
      JsonWriter& w = ev.Instant("dump: " + s.reason.Name(), pid, 0, us(host, s.time_mono_ns), "p");
      w.Key("args").BeginObject();
      w.Field("detail", s.detail);
      w.Field("file", x->file_name);
      w.EndObject();
      ev.End();
      if (s.stalled) {
        const trace::Op& so = *s.stalled;
        const std::string which = so.IsP2p() ? " #" + std::to_string(so.p2p_seq) + " with peer " + std::to_string(so.peer)
                                             : " seq " + std::to_string(so.seq);
        JsonWriter& st = ev.Instant("stall: " + std::string(so.OpName()) + which, pid, 0, us(host, s.time_mono_ns), "p");
        st.Key("args").BeginObject();
        st.Field("comm", s.stalled->comm);
        st.Field("age_s", s.stalled->age_s);
        st.Field("deadline_s", s.stalled->deadline_s);
        st.EndObject();
        ev.End();
      }
    }
  }
  ev.Flush();
  write("\n]}\n");
  stats.events = ev.events();
  return stats;
}

}  // namespace analysis
}  // namespace ncclwatch
