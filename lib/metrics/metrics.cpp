#include "metrics/metrics.h"

#include <unistd.h>

#include <algorithm>
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

// Appends to a string whose storage is kept: no temporaries.
class Text {
 public:
  explicit Text(std::string* out) : out_(*out) { out_.clear(); }
  // One metric family: HELP and TYPE once, then its samples.
  void Family(const char* name, const char* type, const char* help) {
    out_.append("# HELP ").append(name).append(" ").append(help).append("\n# TYPE ").append(name).append(" ");
    out_.append(type).append("\n");
  }
  // `labels`, then `more` (may be ""), as one label set.
  void Sample(const char* name, const char* labels, const char* more, double value) {
    char v[64];
    std::snprintf(v, sizeof v, "%.17g", value);
    out_.append(name).append("{").append(labels).append(more).append("} ").append(v).append("\n");
  }

 private:
  std::string& out_;
};

// rank="R",comm="<hex>" into `buf`.
const char* CommLabels(char* buf, size_t size, const char* rank, uint64_t id) {
  std::snprintf(buf, size, "%s,comm=\"%016llx\"", rank, static_cast<unsigned long long>(id));
  return buf;
}

const char* OpLabel(char* buf, size_t size, trace::OpKind kind) {
  std::snprintf(buf, size, ",op=\"%s\"", trace::OpKindName(kind));
  return buf;
}

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
    Totals& t = totals_[{{op.comm_id, op.comm_rank}, op.kind}];
    ++t.ops;
    t.bytes += op.bytes;
  }
}

std::string MetricsWriter::Render(const MetricsInput& in, uint64_t now_mono_ns, uint64_t now_unix_ns) {
  std::string out;
  RenderInto(in, now_mono_ns, now_unix_ns, &out);
  return out;
}

int MetricsWriter::RankLabel(const MetricsInput& in, CommKey key) const {
  if (!several_ranks_) return in.rank;
  for (const CommInfo* c : in.comms)
    if (c->id == key.first && c->rank == key.second)
      for (const auto& [device, rank] : device_ranks_)
        if (device == c->device) return rank;
  return in.rank;
}

void MetricsWriter::RenderInto(const MetricsInput& in, uint64_t now_mono_ns, uint64_t now_unix_ns, std::string* out) {
  Text t(out);
  char rank[32], comm[96], op[64], comm_rank[32];
  std::snprintf(rank, sizeof rank, "rank=\"%d\"", in.rank);
  // A process that drives several ranks: each communicator's series carry the rank that holds it.
  several_ranks_ = false;
  device_ranks_.clear();
  for (size_t i = 0; i < in.comms.size() && !several_ranks_; ++i)
    for (size_t j = 0; j < i && !several_ranks_; ++j)
      several_ranks_ = in.comms[i]->id == in.comms[j]->id && in.comms[i]->rank != in.comms[j]->rank;
  if (several_ranks_) {
    std::vector<int> sizes;  // of each device_ranks_ entry's communicator
    for (const CommInfo* c : in.comms) {
      auto it = std::find_if(device_ranks_.begin(), device_ranks_.end(), [&](const auto& e) { return e.first == c->device; });
      if (it == device_ranks_.end()) {
        device_ranks_.push_back({c->device, c->rank});
        sizes.push_back(c->size);
      } else if (c->size > sizes[static_cast<size_t>(it - device_ranks_.begin())]) {
        it->second = c->rank;
        sizes[static_cast<size_t>(it - device_ranks_.begin())] = c->size;
      }
    }
  }
  auto labels = [&](CommKey key) {
    if (!several_ranks_) return CommLabels(comm, sizeof comm, rank, key.first);
    std::snprintf(comm_rank, sizeof comm_rank, "rank=\"%d\"", RankLabel(in, key));
    return CommLabels(comm, sizeof comm, comm_rank, key.first);
  };

  t.Family("ncclwatch_operations_total", "counter", "NCCL operations issued, by communicator and operation.");
  for (const auto& [key, v] : totals_)
    t.Sample("ncclwatch_operations_total", labels(key.first), OpLabel(op, sizeof op, key.second), static_cast<double>(v.ops));
  t.Family("ncclwatch_bytes_total", "counter", "Bytes of the NCCL operations issued (nccl-tests' size).");
  for (const auto& [key, v] : totals_)
    t.Sample("ncclwatch_bytes_total", labels(key.first), OpLabel(op, sizeof op, key.second), static_cast<double>(v.bytes));

  t.Family("ncclwatch_collectives_completed_total", "counter", "Collectives the GPU completed, by communicator.");
  for (const CommInfo* c : in.comms)
    t.Sample("ncclwatch_collectives_completed_total", labels({c->id, c->rank}), "",
             static_cast<double>(c->live().last_completed.load()));

  // In flight, per communicator and operation, and the oldest per communicator with its deadline
  // (sorted vectors, in the order a map would give).
  inflight_.clear();
  oldest_.clear();
  for (const auto& v : in.inflight) {
    if (v.op.state == trace::OpState::Completed) continue;
    const CommKey ck{v.op.comm_id, v.op.comm_rank};
    const std::pair<CommKey, trace::OpKind> key{ck, v.op.kind};
    auto it = std::lower_bound(inflight_.begin(), inflight_.end(), key,
                               [](const auto& e, const auto& k) { return e.first < k; });
    if (it == inflight_.end() || it->first != key) it = inflight_.insert(it, {key, 0});
    ++it->second;
    auto o = std::lower_bound(oldest_.begin(), oldest_.end(), ck,
                              [](const auto& e, const CommKey& k) { return e.first < k; });
    if (o == oldest_.end() || o->first != ck) o = oldest_.insert(o, {ck, nullptr});
    if (!o->second || v.age_s > o->second->age_s) o->second = &v;
  }
  t.Family("ncclwatch_operations_in_flight", "gauge", "NCCL operations issued and not completed.");
  for (const auto& [key, n] : inflight_)
    t.Sample("ncclwatch_operations_in_flight", labels(key.first), OpLabel(op, sizeof op, key.second), n);
  t.Family("ncclwatch_oldest_in_flight_seconds", "gauge", "Age of the oldest operation in flight.");
  for (const auto& [id, v] : oldest_)
    t.Sample("ncclwatch_oldest_in_flight_seconds", labels(id), "", v->age_s);
  t.Family("ncclwatch_deadline_seconds", "gauge", "The deadline applied to the oldest operation in flight.");
  for (const auto& [id, v] : oldest_)
    t.Sample("ncclwatch_deadline_seconds", labels(id), "", v->deadline_s);

  t.Family("ncclwatch_seconds_since_last_completion", "gauge",
           "Seconds since the communicator last completed a collective (to the sampling interval).");
  for (const CommInfo* c : in.comms) {
    uint64_t seq = c->live().last_completed.load();
    auto& last = last_completion_[{c->id, c->rank}];
    if (last.second == 0 || seq != last.first) last = {seq, now_mono_ns};
    t.Sample("ncclwatch_seconds_since_last_completion", labels({c->id, c->rank}), "",
             static_cast<double>(now_mono_ns - last.second) / 1e9);
  }

  t.Family("ncclwatch_stalls_total", "counter", "Operations that passed their deadline.");
  t.Sample("ncclwatch_stalls_total", rank, "", static_cast<double>(in.stalls));
  t.Family("ncclwatch_dumps_total", "counter", "Dumps this process wrote.");
  t.Sample("ncclwatch_dumps_total", rank, "", static_cast<double>(in.dumps));
  t.Family("ncclwatch_last_update_timestamp_seconds", "gauge", "When this file was written (Unix time).");
  t.Sample("ncclwatch_last_update_timestamp_seconds", rank, "", static_cast<double>(now_unix_ns / 1000000) / 1e3);
  t.Family("ncclwatch_info", "gauge", "Always 1: the process is watched; labels say by what.");
  std::snprintf(op, sizeof op, ",nccl_version=\"%d\"", in.nccl_version);
  t.Sample("ncclwatch_info", rank, op, 1);
}

bool MetricsWriter::Write(const MetricsInput& in, uint64_t now_mono_ns, uint64_t now_unix_ns) {
  int e = WriteFileReplacing(file_, Render(in, now_mono_ns, now_unix_ns));
  errno = e;
  return e == 0;
}

void MetricsWriter::Remove() { unlink(file_.c_str()); }

uint64_t MetricsWriter::Tend(uint64_t now, const FlightRing& ring, const std::function<void(MetricsInput*)>& fill) {
  Count(ring);
  if (now < next_write_ns_) return now;
  next_write_ns_ = now + timing::Ns(timing::kMetricsInterval);
  input_.comms.clear();
  input_.inflight.clear();
  fill(&input_);
  RenderInto(input_, now, UnixNs(), &text_);
  if (tmp_path_.empty()) {  // hidden beside it, as WriteFileReplacing's: dir/.tmp-<name>-<pid>
    const size_t slash = file_.rfind('/');
    tmp_path_ = (slash == std::string::npos ? std::string(".") : file_.substr(0, slash)) + "/.tmp-" +
                (slash == std::string::npos ? file_ : file_.substr(slash + 1)) + "-" + std::to_string(getpid());
  }
  const int e = WriteFileReplacingVia(file_, tmp_path_, text_, 0644);
  if (e != 0 && !write_failure_said_) {
    write_failure_said_ = true;
    LogWarn("cannot write %s: %s; metrics are retried every %d s", file_.c_str(), strerror(e),
            timing::Ms(timing::kMetricsInterval) / 1000);
  }
  return now;  // counted every tick
}

}  // namespace ncclwatch
