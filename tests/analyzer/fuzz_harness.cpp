#include "fuzz_harness.h"

#include "rules/attribution.h"
#include "format/dump_reader.h"
#include "model/dump_set.h"
#include "render/render_dump.h"
#include "render/render_report.h"

namespace ncclwatch {
namespace testing {
// A named namespace for the using-directive: in the analyzer tests' unity build, one in
// namespace testing would reach every file that uses it (analysis::Dump against testing::Dump).
namespace fuzz_harness {
namespace {

using namespace analysis;
using analysis::Dump;  // not testing::Dump, the fixture

// Peers for the fuzzed dump: idle copies holding the other ranks of its communicators, so
// that attribution has members to compare (and blame).
std::vector<Dump> WithIdlePeers(const Dump& d) {
  std::vector<Dump> set = {d};
  int peers = 0;
  for (const auto& c : d.summary.comms) peers = std::max(peers, std::min(c.size, 16));
  for (int r = 0; r < peers; ++r) {
    if (r == d.summary.rank) continue;
    Dump p;
    p.summary = d.summary;
    p.summary.rank = r;
    p.summary.host = d.summary.host + "-peer";  // a process of its own
    p.summary.pid = r;
    p.summary.in_flight.clear();
    p.summary.stalled.reset();
    for (auto& c : p.summary.comms) {
      c.rank = c.size > 0 ? r % c.size : r;
      c.last_enqueued = c.last_gpu_reached = c.last_completed = std::max<int64_t>(0, c.last_completed - r % 3);
    }
    set.push_back(std::move(p));
  }
  return set;
}

void Render(const Report& report) {
  ReportTextOptions text;
  text.verbose = true;
  (void)RenderReportText(report, text);
  (void)ReportToJson(report).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

void ExerciseDumpBytes(std::string_view bytes) {
  Dump summary_only;
  (void)trace::ReadDumpBuffer(bytes, trace::ReadDepth::kSummary, &summary_only);

  trace::DumpDocument doc = trace::ParseDocumentFromBuffer(bytes, trace::ReadDepth::kFull);
  Dump full;
  full.file_name = "fuzzed.json";
  trace::ReadResult r = trace::InterpretDocument(doc, trace::ReadDepth::kFull, &full);
  if (!r.usable) return;
  ShowOptions show;
  (void)RenderDumpText(full, show);
  (void)DumpToJson(doc, full.file_name, show).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);

  DumpSet alone;
  alone.LoadFromDumps({full});
  if (!alone.dumps().empty()) Render(Attribute(alone));
  DumpSet with_peers;
  with_peers.LoadFromDumps(WithIdlePeers(full));
  if (!with_peers.dumps().empty()) Render(Attribute(with_peers));
}

}  // namespace
}  // namespace fuzz_harness

void ExerciseDumpBytes(std::string_view bytes) { fuzz_harness::ExerciseDumpBytes(bytes); }

}  // namespace testing
}  // namespace ncclwatch
