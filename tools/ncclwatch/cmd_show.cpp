// `ncclwatch show FILE`: one rank's dump as readable tables (or trimmed JSON).
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "format/dump_reader.h"
#include "render/render_dump.h"
#include "debuginfo/symbolize_debug.h"
#include "render/text_format.h"
#include "subcommand.h"

namespace ncclwatch {
namespace cli {

namespace {

using namespace analysis;

void Help(std::FILE* out) {
  std::fprintf(out,
               "usage: ncclwatch show FILE [--ring N] [--json] [--no-color]\n\n"
               "Prints one dump: who dumped and why, communicators with their sequence state,\n"
               "operations in flight with age and deadline, the last N ring entries (default 20),\n"
               "every thread's stack (Python frames first) and the call sites.\n\n"
               "  --ring N     how many of the newest ring entries to print\n"
               "  --json       the dump's own JSON, ring cut to the last N entries\n"
               "  --no-color   no colour even on a terminal (NO_COLOR=1 does the same)\n"
               "exit status: 0 shown, 2 unreadable file or bad usage.\n");
}

void Print(const trace::DumpDocument& doc, const Dump& dump, bool json_out, bool no_color, ShowOptions& options);

int Run(int argc, char** argv) {
  bool json_out = false, no_color = false;
  ShowOptions options;
  const ArgSpec spec = {"show", Help,
                        {{"--json", nullptr, nullptr, SetTo(&json_out, true)},
                         {"--no-color", nullptr, nullptr, SetTo(&no_color, true)},
                         {"--ring", nullptr, "a number >= 0", [&](const char* v) {
                            char* end = nullptr;
                            const long n = std::strtol(v, &end, 10);
                            if (!*v || n < 0 || !end || *end) return std::string("--ring needs a number >= 0");
                            options.ring_entries = static_cast<size_t>(n);
                            return std::string();
                          }}},
                        "file"};
  const ParsedArgs args = ParseArgs(spec, argc, argv);
  if (args.exit_status >= 0) return args.exit_status;
  const char* file = args.operand.c_str();
  struct stat st {};
  if (stat(file, &st) == 0 && S_ISDIR(st.st_mode)) {
    std::fprintf(stderr,
                 "ncclwatch: %s: a directory: `ncclwatch show FILE` prints one dump (a rank*.json file in it); "
                 "`ncclwatch analyze %s` analyzes the directory\n",
                 Printable(file).c_str(), Printable(file).c_str());
    return kExitBadInput;
  }

  trace::DumpDocument doc = trace::ParseDocumentFromFile(file, trace::ReadDepth::kFull);
  Dump dump;
  const char* slash = std::strrchr(file, '/');
  dump.dir = std::make_shared<const std::string>(slash ? std::string(file, slash) : std::string("."));
  dump.file_name = slash ? slash + 1 : file;
  trace::ReadResult r = trace::InterpretDocument(doc, trace::ReadDepth::kFull, &dump);
  if (!r.usable) {  // the path as given: the base name alone does not say which file
    std::fprintf(stderr, "ncclwatch: %s: %s%s\n", Printable(file).c_str(), Printable(r.problem).c_str(),
                 stat(file, &st) != 0 ? "; give the path of a dump (a rank*.json file in the job's dump directory)"
                                      : "");
    return kExitBadInput;
  }
  if (!r.problem.empty()) std::fprintf(stderr, "ncclwatch: %s: %s\n", Printable(dump.file_name).c_str(), Printable(r.problem).c_str());
  try {
    Print(doc, dump, json_out, no_color, options);
  } catch (const std::bad_alloc&) {  // under a memory cap: one line, never an abort
    std::fprintf(stderr, "ncclwatch: %s: out of memory printing it\n", Printable(file).c_str());
    return kExitBadInput;
  }
  return kExitOk;
}

void Print(const trace::DumpDocument& doc, const Dump& dump, bool json_out, bool no_color, ShowOptions& options) {
  if (json_out) {
    std::string text = DumpToJson(doc, dump.file_name, options).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  } else {
    options.style = Style(Style::ColorWanted(no_color));
    options.source_lines = SymbolizeDump(dump);
    std::string text = RenderDumpText(dump, options);
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
}

}  // namespace

extern const Subcommand kShowCommand = {"show", "print one rank's dump as readable tables", Run, Help};

}  // namespace cli
}  // namespace ncclwatch
