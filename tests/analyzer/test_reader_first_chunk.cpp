// The summary pass parses a dump's first chunk (8 KB) as one block when the summary ends in it,
// and reads the file chunk by chunk otherwise: both ways must give the same summary and the same
// problem line, wherever the summary ends and wherever a file is cut or broken.
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "format/dump_reader.h"
#include "fixtures.h"

using namespace ncclwatch;
using namespace ncclwatch::testing;
using trace::ReadDepth;

namespace {

// A dump whose summary is about `comms` * 200 bytes, and a ring after it.
std::string DumpText(int comms) {
  std::vector<trace::CommSummary> list;
  for (int i = 0; i < comms; ++i) list.push_back(Comm("c" + std::to_string(i), 4, 1, 5, 5, 4));
  Document d = Dump(1, 4, list);
  d.detail.ring = {1000, 1000, 0, {}};
  for (int64_t i = 0; i < 1000; ++i) d.detail.ring.entries.push_back(Op("c0", i + 1, "AllReduce", "completed", -1));
  return Text(d);
}

// The summary pass over a file, against the same bytes parsed as one buffer (never chunked).
void ExpectSameAsBuffer(TempDir& dir, const std::string& text) {
  analysis::Dump from_file, from_buffer;
  auto f = trace::ReadDumpFile(dir.Write("dump.json", text), ReadDepth::kSummary, &from_file);
  auto b = trace::ReadDumpBuffer(text, ReadDepth::kSummary, &from_buffer);
  INFO("size " << text.size() << ": " << f.problem);
  CHECK(f.usable == b.usable);
  CHECK(f.problem == b.problem);
  CHECK(f.file_size == text.size());
  CHECK(f.bytes_read <= text.size());
  CHECK(from_file.summary.rank == from_buffer.summary.rank);
  CHECK(from_file.summary.comms.size() == from_buffer.summary.comms.size());
}

}  // namespace

TEST_CASE("the summary pass reads the same whether the summary ends in the first chunk or after it", "[reader]") {
  TempDir dir;
  for (int comms : {1, 30, 41, 42, 60, 200}) {  // summaries of 0.5 KB to 40 KB, about the 8 KB chunk
    const std::string text = DumpText(comms);
    const size_t summary_end = text.find("},\"process\"") != std::string::npos ? text.find("},\"process\"") : text.size() / 2;
    ExpectSameAsBuffer(dir, text);
    // Cut, or broken by a stray byte, before, at and after the 8 KB chunk and the summary's end.
    for (size_t at : {size_t{1}, size_t{100}, size_t{8191}, size_t{8192}, size_t{8193}, summary_end, summary_end + 1,
                      summary_end + 2, text.size() - 1}) {
      if (at >= text.size()) continue;
      ExpectSameAsBuffer(dir, text.substr(0, at));
      std::string broken = text;
      broken[at] = '#';
      ExpectSameAsBuffer(dir, broken);
    }
    // A key given twice in the summary, near its end.
    std::string twice = text;
    twice.insert(twice.find("\"rank\":1"), "\"rank\":1,");
    ExpectSameAsBuffer(dir, twice);
  }
  // The summary ending in the first chunk is read from it alone.
  analysis::Dump d;
  auto r = trace::ReadDumpFile(dir.Write("dump.json", DumpText(1)), ReadDepth::kSummary, &d);
  CHECK(r.usable);
  REQUIRE(r.file_size > 8192);
  CHECK(r.bytes_read == 8192);
}
