// Rendering an analysis report: readable text (optionally coloured) and the documented JSON.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/report.h"
#include "render/style.h"

namespace ncclwatch {
namespace analysis {

struct ReportTextOptions {
  Style style;
  bool verbose = false;  // every culprit's full stacks instead of the first frames
};

std::string RenderReportText(const Report& report, const ReportTextOptions& options);
// The one-line advice of a verdict: every sentence of the report is written here, from the
// verdict's data (attribution decides, the renderer words it).
std::string AdviceText(const Verdict& v, const Report& report);
nlohmann::json ReportToJson(const Report& report);
// Where a culprit is, as one line: "inside ncclGroupEnd for 612 s (tid 7); its GPU has not
// reached #42 (issued 610 s ago)".
std::string PositionText(const CulpritPosition& p);
// How a framework ended a waiting rank after the wait: "ncclCommAbort, then SIGABRT".
std::string FrameworkEndingText(const FrameworkEnded& e);
// The verdict's waiting ranks their framework ended after the wait, one line per way:
// "ranks 0-2: ended by their framework after the wait (ncclCommAbort, then SIGABRT)".
std::vector<std::string> FrameworkEndingLines(const Verdict& v);
std::string WhereText(const CulpritEvidence& e);
// A problem with a file of the set: its sentence, and the line commands print on stderr.
std::string ProblemText(const Problem& p);
std::string ProblemLine(const Problem& p);
// Notes about the evidence: stale dumps, several attempts in one directory.
std::vector<std::string> NotesText(const Report& report);

}  // namespace analysis
}  // namespace ncclwatch
