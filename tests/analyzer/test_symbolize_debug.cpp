// Source lines of native frames from local debug info (analysis/symbolize_debug.h), on this very
// program (compiled with -g): only for the exact build, from the module or its build-id file.
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <catch2/catch.hpp>

#include "common/process_info.h"
#include "debuginfo/symbolize_debug.h"
#include "render/text_format.h"

using namespace ncclwatch::analysis;
namespace trace = ncclwatch::trace;

namespace symbolize_debug_test {

__attribute__((noinline)) uintptr_t ReturnAddress() { return reinterpret_cast<uintptr_t>(__builtin_return_address(0)); }

// The return address of a call on a known line, as a captured stack holds it.
__attribute__((noinline)) uintptr_t SampleCallSite(int* line) {
  const uintptr_t ip = ReturnAddress(); *line = __LINE__;
  asm volatile("" ::: "memory");  // not a tail call
  return ip;
}

}  // namespace symbolize_debug_test

namespace {

struct Program {
  std::string path;
  std::string build_id;
  uintptr_t bias = 0;
};

// This program as ncclwatch's Symbolize records it: its path, build id and load bias.
Program ThisProgram() {
  Program program;
  program.path = ncclwatch::ExecutablePath();
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        auto* p = static_cast<Program*>(arg);
        p->bias = info->dlpi_addr;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type != PT_NOTE) continue;
          const auto* at = reinterpret_cast<const unsigned char*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
          const unsigned char* end = at + info->dlpi_phdr[i].p_memsz;
          while (at + sizeof(ElfW(Nhdr)) <= end) {
            ElfW(Nhdr) note;
            std::memcpy(&note, at, sizeof note);
            const unsigned char* desc = at + sizeof note + ((note.n_namesz + 3) & ~3u);
            if (note.n_type == NT_GNU_BUILD_ID) {
              for (size_t b = 0; b < note.n_descsz; ++b) {
                char hex[3];
                std::snprintf(hex, sizeof hex, "%02x", desc[b]);
                p->build_id += hex;
              }
            }
            at = desc + ((note.n_descsz + 3) & ~3u);
          }
        }
        return 1;  // the first object is the program
      },
      &program);
  return program;
}

trace::NativeFrame SampleFrame(int* line) {
  const Program program = ThisProgram();
  trace::NativeFrame frame;
  frame.ip = symbolize_debug_test::SampleCallSite(line);
  frame.module = program.path;
  frame.build_id = program.build_id;
  frame.module_offset = frame.ip - program.bias;
  frame.symbol = "symbolize_debug_test::SampleCallSite(int*)";
  frame.offset = 0x10;
  return frame;
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The frame through the symbolization pass, as the renderers get it.
SourceLines Symbolized(const trace::NativeFrame& f) {
  CulpritEvidence e;
  e.current.native.push_back(f);
  Verdict v;
  v.evidence.push_back(e);
  Report r;
  r.verdicts.push_back(v);
  SymbolizeReport(&r);
  return r.source_lines;
}

}  // namespace

TEST_CASE("a native frame gets file:line from the debug info of its exact build", "[symbolize]") {
  int line = 0;
  const trace::NativeFrame frame = SampleFrame(&line);
  REQUIRE(frame.build_id.size() >= 8);
  const std::optional<SourceLine> source = SourceLineOf(frame);
  REQUIRE(source);
  CHECK(EndsWith(source->file, "test_symbolize_debug.cpp"));
  CHECK(source->line == line);
  CHECK(source->function.empty());  // the frame has its symbol
  const std::string text = FormatNativeFrame(frame, Symbolized(frame));
  CHECK(FormatNativeFrame(frame, SourceLines()).find(" at ") == std::string::npos);  // renderers read no file
  CHECK(text.find("symbolize_debug_test::SampleCallSite(int*)+0x10") == 0);
  CHECK(EndsWith(text, "test_symbolize_debug.cpp:" + std::to_string(line)));

  trace::NativeFrame unnamed = frame;  // a frame Symbolize could not name (a stripped library's static function)
  unnamed.symbol.clear();
  const std::optional<SourceLine> named = SourceLineOf(unnamed);
  REQUIRE(named);
  CHECK(named->function == "symbolize_debug_test::SampleCallSite(int*)");
  CHECK(FormatNativeFrame(unnamed, Symbolized(unnamed)).find("symbolize_debug_test::SampleCallSite(int*) (") == 0);
}

TEST_CASE("no source line for another build, a frame without build id, or a module not here", "[symbolize]") {
  int line = 0;
  const trace::NativeFrame frame = SampleFrame(&line);
  trace::NativeFrame other_build = frame;
  other_build.build_id[0] = other_build.build_id[0] == '0' ? '1' : '0';
  CHECK(!SourceLineOf(other_build));
  CHECK(FormatNativeFrame(other_build, Symbolized(other_build)).find(" at ") == std::string::npos);
  trace::NativeFrame no_build_id = frame;
  no_build_id.build_id.clear();
  CHECK(!SourceLineOf(no_build_id));
  trace::NativeFrame elsewhere = frame;
  elsewhere.module = "/nonexistent/" + frame.build_id + "/program";
  CHECK(!SourceLineOf(elsewhere));
  trace::NativeFrame fifo = frame;
  fifo.module = "/dev/stdin";  // never opened: not a regular file
  CHECK(!SourceLineOf(fifo));
}

TEST_CASE("a module not here is found by its build id under the debug directory", "[symbolize]") {
  int line = 0;
  trace::NativeFrame frame = SampleFrame(&line);
  char root[] = "/tmp/ncclwatch-debug-XXXXXX";
  REQUIRE(mkdtemp(root) != nullptr);
  const std::string dir = std::string(root) + "/.build-id/" + frame.build_id.substr(0, 2);
  REQUIRE(mkdir((std::string(root) + "/.build-id").c_str(), 0755) == 0);
  REQUIRE(mkdir(dir.c_str(), 0755) == 0);
  const std::string debug_file = dir + "/" + frame.build_id.substr(2) + ".debug";
  REQUIRE(symlink(frame.module.c_str(), debug_file.c_str()) == 0);
  SetDebugFileDirectory(root);
  frame.module = "/the/job/machine/only/program";
  const std::optional<SourceLine> source = SourceLineOf(frame);
  SetDebugFileDirectory("/usr/lib/debug");
  unlink(debug_file.c_str());
  rmdir(dir.c_str());
  rmdir((std::string(root) + "/.build-id").c_str());
  rmdir(root);
  REQUIRE(source);
  CHECK(EndsWith(source->file, "test_symbolize_debug.cpp"));
  CHECK(source->line == line);
}

namespace symbolize_debug_test {
__attribute__((noinline)) int BeforeCrashSite(int x) { return x * 3 + 1; }
__attribute__((noinline)) int CrashSite(int x) { return x * 5 + 2; }
}  // namespace symbolize_debug_test

TEST_CASE("an interrupted frame is looked up at its own address, a return address at the byte before", "[symbolize]") {
  // A fault on a function's first instruction: the frame below the signal is that instruction.
  REQUIRE(symbolize_debug_test::BeforeCrashSite(1) + symbolize_debug_test::CrashSite(1) == 11);
  const Program program = ThisProgram();
  trace::NativeFrame frame;
  frame.ip = reinterpret_cast<uintptr_t>(&symbolize_debug_test::CrashSite);
  frame.module = program.path;
  frame.build_id = program.build_id;
  frame.module_offset = frame.ip - program.bias;
  frame.interrupted = true;
  const std::optional<SourceLine> source = SourceLineOf(frame);
  REQUIRE(source);
  CHECK(source->function == "symbolize_debug_test::CrashSite(int)");
  CHECK(EndsWith(source->file, "test_symbolize_debug.cpp"));
  CHECK(FormatNativeFrame(frame, Symbolized(frame)).find("symbolize_debug_test::CrashSite(int) (") == 0);
  trace::NativeFrame returned = frame;  // the same value as a return address is not inside it
  returned.interrupted = false;
  const std::optional<SourceLine> before = SourceLineOf(returned);
  CHECK((!before || before->function != "symbolize_debug_test::CrashSite(int)"));
}
