#include "render/render_dump.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <sstream>

#include "format/display.h"
#include "format/request.h"
#include "render/text_format.h"
#include "report/vocabulary.h"

namespace ncclwatch {
namespace analysis {

using nlohmann::json;
namespace key = trace::key;

namespace {

// A left-aligned text table: widths follow the widest cell of each column.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  // Cells come from the dump: escaped here, once for every table.
  void Add(std::vector<std::string> row) {
    for (auto& cell : row) cell = Printable(cell);
    rows_.push_back(std::move(row));
  }
  void Render(std::ostream& out, const Style& st, const char* indent) const {
    std::vector<size_t> width;
    for (const auto& r : rows_)
      for (size_t i = 0; i < r.size(); ++i) {
        if (width.size() <= i) width.push_back(0);
        width[i] = std::max(width[i], r[i].size());
      }
    for (size_t ri = 0; ri < rows_.size(); ++ri) {
      std::string line;
      for (size_t i = 0; i < rows_[ri].size(); ++i) {
        line += rows_[ri][i];
        if (i + 1 < rows_[ri].size()) line += std::string(width[i] - rows_[ri][i].size() + 2, ' ');
      }
      line.erase(line.find_last_not_of(' ') + 1);
      out << indent << (ri == 0 ? st.Dim(line) : line) << "\n";
    }
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string Num(int64_t v) { return std::to_string(v); }
// Seconds from `from` to `to` (same host's clock); in double so corrupt values cannot overflow.
double NsBetween(int64_t from, int64_t to) { return (static_cast<double>(to) - static_cast<double>(from)) / 1e9; }
std::string Secs(double s) { return s < 0 ? "-" : FormatSeconds(s); }

std::string StateName(const trace::Op& op) {
  return op.state.known ? trace::OpStateName(op.state.value) : "?";
}

std::string SeqCell(const trace::Op& op) {
  return op.IsP2p() ? "p2p " + Num(op.p2p_seq) : Num(op.seq);
}

std::string ShortComm(const std::string& id) { return id.size() > 8 ? id.substr(0, 8) + ".." : id; }

std::vector<std::string> OpCells(const trace::Op& op) {
  std::string what = op.OpName();
  if (op.IsP2p()) what += (op.op == trace::OpKind::Send ? " to " : " from ") + Num(op.peer);
  if (op.root >= 0) what += " root " + Num(op.root);
  return {what, ShortComm(op.comm), SeqCell(op), StateName(op), Num(op.count),
          op.dtype + (op.redop.empty() ? "" : " " + op.redop), FormatBytes(op.bytes)};
}

}  // namespace

// Who sent a job-wide dump request: a rank, or the `ncclwatch dump` command.
static std::string RequesterText(const trace::AnsweredRequest& t) {
  if (trace::AskedByCommand(t.origin_rank, t.reason))
    return "`ncclwatch dump` on " + Printable(t.origin_host);
  return (t.origin_rank >= 0 ? "rank " + std::to_string(t.origin_rank) : std::string("a rank not known yet")) + " (" +
         Printable(t.origin_host) + ")";
}

std::string RenderDumpText(const Dump& dump, const ShowOptions& options) {
  const Style& st = options.style;
  const trace::Summary& s = dump.summary;
  std::ostringstream out;

  // Every string from the dump is escaped (Printable): a host or thread name must not drive the terminal.
  out << st.Bold(Printable(dump.file_name)) << "\n";
  out << "rank " << (s.rank >= 0 ? Num(s.rank) : "?") << " of " << (s.world_size > 0 ? Num(s.world_size) : "?")
      << " (local " << (s.local_rank >= 0 ? Num(s.local_rank) : "?") << ")  host " << Printable(s.host) << "  pid " << s.pid
      << "  dump #" << s.dump_seq << "  reason " << st.Red(Printable(s.reason.Name())) << "\n";
  if (!s.detail.empty()) out << "detail: " << Printable(s.detail) << "\n";
  if (s.answered)
    out << "asked by " << RequesterText(*s.answered) << ", reason " << Printable(s.answered->reason) << ", request "
        << Printable(s.answered->request) << "\n";
  out << "dumped " << FormatWallClock(s.time_unix_ns) << " (this host's clock); ncclwatch up "
      << Secs(NsBetween(s.start_mono_ns, s.time_mono_ns));
  if (s.nccl_version > 0) out << "; NCCL " << trace::NcclVersionText(s.nccl_version);
  out << "\n";
  if (s.in_nccl.empty() && !s.in_flight.empty()) {
    // Its host returned from NCCL and what it issued has not completed: where the oldest is on
    // the GPU is known; what the host does meanwhile, its threads say.
    const trace::Op& oldest = s.in_flight.front();
    const std::string where = oldest.state.Is(trace::OpState::GpuReached) ? "its GPU is inside it"
                              : oldest.state.Is(trace::OpState::Enqueued) ? "its GPU has not reached it"
                                                                          : std::string(oldest.state.known ? trace::OpStateName(oldest.state.value) : "state unknown");
    out << "in NCCL: no thread inside an NCCL call; " << s.in_flight.size() << " operation"
        << (s.in_flight.size() > 1 ? "s" : "") << " in flight, the oldest " << Printable(oldest.OpName()) << " #"
        << (oldest.IsP2p() ? oldest.p2p_seq : oldest.seq) << " (" << where << "); the threads below show what the "
        << "host does meanwhile\n";
  } else if (s.in_nccl.empty()) {
    out << "in NCCL: no thread and nothing in flight (the process is busy elsewhere: see threads)\n";
  } else {
    for (const auto& t : s.in_nccl)
      out << "in NCCL: tid " << t.tid << " in " << Printable(t.function) << " for " << Secs(t.since_s) << "\n";
  }

  out << "\n" << st.Bold("communicators") << "\n";
  Table comms({"id", "name", "size", "rank", "state", "enqueued", "gpu_reached", "completed", "p2p (peer: sent/recv issued)"});
  for (const auto& c : s.comms) {
    std::string p2p;
    for (const auto& p : c.p2p)
      p2p += (p2p.empty() ? "" : ", ") + Num(p.peer) + ": " + Num(p.send_enqueued) + "/" + Num(p.recv_enqueued);
    comms.Add({c.id, c.name, Num(c.size), Num(c.rank), c.state, Num(c.last_enqueued), Num(c.last_gpu_reached),
               Num(c.last_completed), p2p});
  }
  comms.Render(out, st, "  ");

  out << "\n" << st.Bold("in flight") << " (oldest first)\n";
  if (s.in_flight.empty()) {
    out << "  none\n";
  } else {
    Table t({"op", "comm", "seq", "state", "count", "dtype", "bytes", "age", "deadline"});
    for (const auto& op : s.in_flight) {
      auto cells = OpCells(op);
      cells.push_back(Secs(op.age_s));
      cells.push_back(Secs(op.deadline_s));
      if (op.deadline_s >= 0 && op.age_s > op.deadline_s) cells.back() += " PASSED";
      t.Add(std::move(cells));
    }
    t.Render(out, st, "  ");
  }
  if (s.stalled)
    out << "stalled: " << Printable(OpLabel(s.stalled->OpName(), s.stalled->seq)) << " on " << Printable(s.stalled->comm) << " after "
        << Secs(s.stalled->age_s) << "\n";

  const trace::Detail* d = dump.detail.get();
  if (!d) {
    out << "\n" << st.Dim("(details unreadable: " + Printable(dump.detail_problem) + ")") << "\n";
    return out.str();
  }
  const auto& entries = d->ring.entries;
  size_t n = std::min(options.ring_entries, entries.size());
  out << "\n" << st.Bold("ring") << ": last " << n << " of " << entries.size() << " entries (" << d->ring.recorded
      << " recorded, " << d->ring.overwritten << " overwritten)\n";
  if (n > 0) {
    Table t({"op", "comm", "seq", "state", "count", "dtype", "bytes", "issued", "gpu_ms", "callsite"});
    for (size_t i = entries.size() - n; i < entries.size(); ++i) {
      const trace::Op& op = entries[i];
      auto cells = OpCells(op);
      cells.push_back(op.enqueue_ns > 0 ? Secs(NsBetween(op.enqueue_ns, s.time_mono_ns)) + " ago" : "-");
      cells.push_back(op.gpu_ms >= 0 ? std::to_string(op.gpu_ms) : "-");
      cells.push_back(op.callsite >= 0 ? "#" + Num(op.callsite) : "-");
      t.Add(std::move(cells));
    }
    t.Render(out, st, "  ");
  }

  out << "\n" << st.Bold("threads") << "\n";
  for (const auto& th : d->threads) {
    out << "  " << st.Bold(th.name.empty() ? "thread" : Printable(th.name)) << " (tid " << th.tid << ")";
    if (th.own) out << "  " << st.Dim("ncclwatch's own");
    if (!th.note.empty()) out << "  " << st.Dim(Printable(th.note));
    out << "\n";
    RenderStack(out, st, th.stack, options.source_lines, "      ");
  }
  out << "\n" << st.Bold("callsites") << "\n";
  for (const auto& c : d->callsites) {
    out << "  #" << c.id;
    if (!c.python_driven_from.empty())
      out << "  " << st.Dim(Printable("Python frames: driven from the " + c.python_driven_from));
    out << "\n";
    RenderStack(out, st, c.stack, options.source_lines, "      ");
  }
  if (!d->recoveries.empty()) {
    out << "\n" << st.Bold("recoveries") << "\n";
    for (const auto& r : d->recoveries)
      out << "  " << Printable(OpLabel(r.op, r.seq)) << " on " << Printable(r.comm) << ": stalled after " << Secs(r.stalled_after_s)
          << ", completed after " << Secs(r.recovered_after_s) << "\n";
  }
  if (!dump.detail_problem.empty()) out << "\n" << st.Dim("(" + Printable(dump.detail_problem) + ")") << "\n";
  return out.str();
}

json DumpToJson(const trace::DumpDocument& doc, const std::string& file, const ShowOptions& options) {
  json out = doc.top;
  auto ring = out.find(key::kRing);
  if (ring != out.end() && ring->is_object()) {
    auto entries = ring->find(key::kEntries);
    if (entries != ring->end() && entries->is_array() && entries->size() > options.ring_entries) {
      json tail(entries->end() - static_cast<std::ptrdiff_t>(options.ring_entries), entries->end());
      *entries = std::move(tail);
    }
  }
  out[analysis::report_key::kFile] = file;
  return out;
}

}  // namespace analysis
}  // namespace ncclwatch
