#include "metrics/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/clock.h"
#include "common/log.h"
#include "common/timing.h"
#include "dump/dump_files.h"
#include "format/file_name.h"

namespace ncclwatch {

namespace {

class Text {
 public:
  // One metric family: HELP and TYPE once, then its samples.
  void Family(const char* name, const char* type, const char* help) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void Sample(const char* name, const std::string& labels, double value) {
    char v[64];
    std::snprintf(v, sizeof v, "%.17g", value);
    out_ += std::string(name) + "{" + labels + "} " + v + "\n";
  }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

}  // namespace

std::string MetricsFileName(const std::string& host, int pid) {
  return "ncclwatch-" + trace::SafeHostName(host) + "-" + std::to_string(pid) + ".prom";  // the collector reads *.prom
}

void MetricsWriter::Count(const FlightRing& ring) {
  uint64_t head = ring.recorded();
  if (head - next_index_ > ring.capacity()) next_index_ = head - ring.capacity();  // lost to overflow
  for (; next_index_ < head; ++next_index_) {
    OpSnapshot op;
    if (!ring.Read(next_index_, &op)) continue;  // still being written: skipped (a statistic)
    Totals& t = totals_[{op.comm_id, op.kind}];
    ++t.ops;
    t.bytes += op.bytes;
  }
}

std::string MetricsWriter::Render(const MetricsInput& in, uint64_t now_mono_ns, uint64_t now_unix_ns) {
  Text t;
  std::string rank = "rank=\"" + std::to_string(in.rank) + "\"";
  auto comm_labels = [&](uint64_t id) { return rank + ",comm=\"" + CommIdHex(id) + "\""; };

  t.Family("ncclwatch_operations_total", "counter", "NCCL operations issued, by communicator and operation.");
  for (const auto& [key, v] : totals_)
    t.Sample("ncclwatch_operations_total", comm_labels(key.first) + ",op=\"" + trace::OpKindName(key.second) + "\"",
             static_cast<double>(v.ops));
  t.Family("ncclwatch_bytes_total", "counter", "Bytes of the NCCL operations issued (nccl-tests' size).");
  for (const auto& [key, v] : totals_)
    t.Sample("ncclwatch_bytes_total", comm_labels(key.first) + ",op=\"" + trace::OpKindName(key.second) + "\"",
             static_cast<double>(v.bytes));

  t.Family("ncclwatch_collectives_completed_total", "counter", "Collectives the GPU completed, by communicator.");
  for (const CommInfo* c : in.comms)
    t.Sample("ncclwatch_collectives_completed_total", comm_labels(c->id), static_cast<double>(c->live().last_completed.load()));

  // In flight, per communicator and operation, and the oldest per communicator with its deadline.
  std::map<std::pair<uint64_t, trace::OpKind>, int> inflight;
  std::map<uint64_t, const InflightView*> oldest;
  for (const auto& v : in.inflight) {
    if (v.op.state == trace::OpState::Completed) continue;
    ++inflight[{v.op.comm_id, v.op.kind}];
    auto& o = oldest[v.op.comm_id];
    if (!o || v.age_s > o->age_s) o = &v;
  }
  t.Family("ncclwatch_operations_in_flight", "gauge", "NCCL operations issued and not completed.");
  for (const auto& [key, n] : inflight)
    t.Sample("ncclwatch_operations_in_flight", comm_labels(key.first) + ",op=\"" + trace::OpKindName(key.second) + "\"",
             n);
  t.Family("ncclwatch_oldest_in_flight_seconds", "gauge", "Age of the oldest operation in flight.");
  for (const auto& [comm, v] : oldest) t.Sample("ncclwatch_oldest_in_flight_seconds", comm_labels(comm), v->age_s);
  t.Family("ncclwatch_deadline_seconds", "gauge", "The deadline applied to the oldest operation in flight.");
  for (const auto& [comm, v] : oldest) t.Sample("ncclwatch_deadline_seconds", comm_labels(comm), v->deadline_s);

  t.Family("ncclwatch_seconds_since_last_completion", "gauge",
           "Seconds since the communicator last completed a collective (to the sampling interval).");
  for (const CommInfo* c : in.comms) {
    uint64_t seq = c->live().last_completed.load();
    auto& last = last_completion_[c->id];
    if (last.second == 0 || seq != last.first) last = {seq, now_mono_ns};
    t.Sample("ncclwatch_seconds_since_last_completion", comm_labels(c->id),
             static_cast<double>(now_mono_ns - last.second) / 1e9);
  }

  t.Family("ncclwatch_stalls_total", "counter", "Operations that passed their deadline.");
  t.Sample("ncclwatch_stalls_total", rank, static_cast<double>(in.stalls));
  t.Family("ncclwatch_dumps_total", "counter", "Dumps this process wrote.");
  t.Sample("ncclwatch_dumps_total", rank, static_cast<double>(in.dumps));
  t.Family("ncclwatch_last_update_timestamp_seconds", "gauge", "When this file was written (Unix time).");
  t.Sample("ncclwatch_last_update_timestamp_seconds", rank, static_cast<double>(now_unix_ns / 1000000) / 1e3);
  t.Family("ncclwatch_info", "gauge", "Always 1: the process is watched; labels say by what.");
  t.Sample("ncclwatch_info", rank + ",nccl_version=\"" + std::to_string(in.nccl_version) + "\"", 1);
  return std::move(t.str());
}

bool MetricsWriter::Write(const MetricsInput& in, uint64_t now_mono_ns, uint64_t now_unix_ns) {
  int e = WriteFileReplacing(file_, Render(in, now_mono_ns, now_unix_ns));
  errno = e;
  return e == 0;
}

void MetricsWriter::Remove() { unlink(file_.c_str()); }

uint64_t MetricsWriter::Tend(uint64_t now, const FlightRing& ring, const std::function<MetricsInput()>& input) {
  Count(ring);
  if (now < next_write_ns_) return now;
  next_write_ns_ = now + timing::Ns(timing::kMetricsInterval);
  if (!Write(input(), now, UnixNs()) && !write_failure_said_) {
    write_failure_said_ = true;
    LogWarn("cannot write %s: %s; metrics are retried every %d s", file_.c_str(), strerror(errno),
            timing::Ms(timing::kMetricsInterval) / 1000);
  }
  return now;  // counted every tick
}

}  // namespace ncclwatch
