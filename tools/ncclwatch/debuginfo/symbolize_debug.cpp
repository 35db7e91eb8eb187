#include "debuginfo/symbolize_debug.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

#include "format/demangle.h"
#include "format/hex.h"

// Built without elfutils' headers (libdw-dev), the analyzer gives no source lines.
#if __has_include(<elfutils/libdwfl.h>)
#include <elfutils/libdwfl.h>
#define NCCLWATCH_HAVE_LIBDW 1
#else
#define NCCLWATCH_HAVE_LIBDW 0
#endif

namespace ncclwatch {
namespace analysis {
namespace {

std::mutex g_mu;
std::string* g_debug_directory = new std::string("/usr/lib/debug");  // leaked: usable at exit

bool IsBuildId(const std::string& id) {
  if (id.size() < 4 || id.size() > 128 || id.size() % 2 != 0) return false;
  for (char c : id)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// Only regular files are opened: a FIFO or device named in a dump is never waited on.
bool IsRegularFile(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string DebugFileFor(const std::string& build_id) {
  return *g_debug_directory + "/.build-id/" + build_id.substr(0, 2) + "/" + build_id.substr(2) + ".debug";
}


#if NCCLWATCH_HAVE_LIBDW

// libdw.so.1, opened at run time: the command needs nothing but glibc to start (tests/install),
// and without libdw (Debian: libdw1) reports just have no source lines.
struct LibDw {
#define NCCLWATCH_DW_FUNCTIONS(X)                                                                            \
  X(Dwfl*, dwfl_begin, (const Dwfl_Callbacks*))                                                              \
  X(void, dwfl_end, (Dwfl*))                                                                                 \
  X(void, dwfl_report_begin, (Dwfl*))                                                                        \
  X(Dwfl_Module*, dwfl_report_elf, (Dwfl*, const char*, const char*, int, GElf_Addr, bool))                  \
  X(int, dwfl_report_end, (Dwfl*, int (*)(Dwfl_Module*, void*, const char*, Dwarf_Addr, void*), void*))      \
  X(Elf*, dwfl_module_getelf, (Dwfl_Module*, GElf_Addr*))                                                    \
  X(int, dwfl_module_build_id, (Dwfl_Module*, const unsigned char**, GElf_Addr*))                            \
  X(Dwfl_Line*, dwfl_module_getsrc, (Dwfl_Module*, Dwarf_Addr))                                              \
  X(const char*, dwfl_lineinfo, (Dwfl_Line*, Dwarf_Addr*, int*, int*, Dwarf_Word*, Dwarf_Word*))             \
  X(const char*, dwfl_module_addrinfo,                                                                       \
    (Dwfl_Module*, GElf_Addr, GElf_Off*, GElf_Sym*, GElf_Word*, Elf**, Dwarf_Addr*))                        \
  X(int, dwfl_offline_section_address, (Dwfl_Module*, void**, const char*, Dwarf_Addr, const char*,         \
                                        GElf_Word, const GElf_Shdr*, Dwarf_Addr*))
#define NCCLWATCH_DW_MEMBER(ret, name, params) ret(*name) params = nullptr;
  NCCLWATCH_DW_FUNCTIONS(NCCLWATCH_DW_MEMBER)
#undef NCCLWATCH_DW_MEMBER
  Dwfl_Callbacks callbacks{};
};

int NoElfSearch(Dwfl_Module*, void**, const char*, Dwarf_Addr, char**, Elf**) { return -1; }
int FindLocalDebugFile(Dwfl_Module*, void**, const char*, Dwarf_Addr, const char*, const char*, GElf_Word, char**);

// Null when libdw.so.1 is not here or lacks a function.
const LibDw* GetLibDw() {
  static const LibDw* dw = []() -> const LibDw* {
    void* library = dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) return nullptr;
    auto* found = new LibDw;
    bool complete = true;
#define NCCLWATCH_DW_FIND(ret, name, params)                                 \
  found->name = reinterpret_cast<ret(*) params>(dlsym(library, #name)); \
  complete = complete && found->name != nullptr;
    NCCLWATCH_DW_FUNCTIONS(NCCLWATCH_DW_FIND)
#undef NCCLWATCH_DW_FIND
    if (!complete) return nullptr;
    // Local files only: the standard callbacks may ask debuginfod servers over the network.
    found->callbacks.find_elf = NoElfSearch;  // the module's file is always given
    found->callbacks.find_debuginfo = FindLocalDebugFile;
    found->callbacks.section_address = found->dwfl_offline_section_address;
    return found;
  }();
  return dw;
}

// A module's separate debug file: the build-id one under the debug directory, if there.
int FindLocalDebugFile(Dwfl_Module* module, void**, const char*, Dwarf_Addr, const char*, const char*, GElf_Word,
                       char** debuginfo_file_name) {
  const unsigned char* bits = nullptr;
  GElf_Addr vaddr = 0;
  const int size = GetLibDw()->dwfl_module_build_id(module, &bits, &vaddr);
  if (size <= 1) return -1;
  const std::string path = DebugFileFor(trace::HexBytes(bits, static_cast<size_t>(size)));
  if (!IsRegularFile(path)) return -1;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) *debuginfo_file_name = strdup(path.c_str());
  return fd;
}

// One module's debug info, opened once; kept for the process's life.
struct ModuleInfo {
  Dwfl* dwfl = nullptr;
  Dwfl_Module* module = nullptr;  // null: nothing usable
  GElf_Addr bias = 0;             // dwfl address = ELF virtual address + bias
};

// `path` reported alone, if its build id is `build_id`.
ModuleInfo OpenModule(const LibDw& dw, const std::string& path, const std::string& build_id) {
  ModuleInfo info;
  if (!IsRegularFile(path)) return info;
  info.dwfl = dw.dwfl_begin(&dw.callbacks);
  if (info.dwfl == nullptr) return info;
  dw.dwfl_report_begin(info.dwfl);
  Dwfl_Module* module = dw.dwfl_report_elf(info.dwfl, path.c_str(), path.c_str(), -1, 0, false);
  dw.dwfl_report_end(info.dwfl, nullptr, nullptr);
  const unsigned char* bits = nullptr;
  GElf_Addr vaddr = 0;
  if (module != nullptr && dw.dwfl_module_getelf(module, &info.bias) != nullptr) {
    const int size = dw.dwfl_module_build_id(module, &bits, &vaddr);
    if (size > 0 && trace::HexBytes(bits, static_cast<size_t>(size)) == build_id) info.module = module;  // exactly that build, or nothing
  }
  if (info.module == nullptr) {
    dw.dwfl_end(info.dwfl);
    info.dwfl = nullptr;
  }
  return info;
}

const ModuleInfo& ModuleFor(const LibDw& dw, const std::string& path, const std::string& build_id) {
  static auto* modules = new std::map<std::pair<std::string, std::string>, ModuleInfo>;
  const auto key = std::make_pair(path, build_id);
  auto found = modules->find(key);
  if (found != modules->end()) return found->second;
  // The module file (its own DWARF, else its build-id debug file: FindLocalDebugFile); where it
  // is absent here or of another build, the build-id debug file alone.
  ModuleInfo info = OpenModule(dw, path, build_id);
  if (info.module == nullptr) info = OpenModule(dw, DebugFileFor(build_id), build_id);
  return modules->emplace(key, info).first->second;
}

std::optional<SourceLine> Resolve(const LibDw& dw, const ModuleInfo& info, const trace::NativeFrame& frame) {
  if (info.module == nullptr || frame.module_offset == 0) return std::nullopt;
  // A return address's call instruction is the byte before; an interrupted frame's address is
  // the instruction itself (a fault on a function's first byte belongs to that function).
  const Dwarf_Addr address = frame.module_offset - (frame.interrupted ? 0 : 1) + info.bias;
  SourceLine out;
  GElf_Off offset = 0;
  GElf_Sym symbol;
  const char* name = dw.dwfl_module_addrinfo(info.module, address, &offset, &symbol, nullptr, nullptr, nullptr);
  // Inside a symbol of known size only: a nearest symbol can be another function.
  const bool in_symbol = name != nullptr && symbol.st_size > 0 && offset < symbol.st_size;
  if (Dwfl_Line* line = dw.dwfl_module_getsrc(info.module, address)) {
    int number = 0;
    Dwarf_Addr at = 0;
    const char* file = dw.dwfl_lineinfo(line, &at, &number, nullptr, nullptr, nullptr);
    // The nearest row of the line table can belong to code before this function (startup code
    // without line info, such as _start, after the program's last function): a row is this
    // frame's only when it lies in the same function and not after the address (addr2line's ??:?).
    const bool same_function = !in_symbol || (at <= address && address - at <= offset);
    if (file != nullptr && number > 0 && at <= address && same_function) {
      out.file = file;
      out.line = number;
    }
  }
  if (frame.symbol.empty() && in_symbol) out.function = trace::Demangle(name);
  if (out.file.empty() && out.function.empty()) return std::nullopt;
  return out;
}

#endif  // NCCLWATCH_HAVE_LIBDW

}  // namespace

std::optional<SourceLine> SourceLineOf(const trace::NativeFrame& frame) {
#if NCCLWATCH_HAVE_LIBDW
  if (!IsBuildId(frame.build_id) || frame.module.empty()) return std::nullopt;
  const LibDw* dw = GetLibDw();
  if (dw == nullptr) return std::nullopt;
  std::lock_guard<std::mutex> lock(g_mu);
  static auto* lines = new std::map<std::tuple<std::string, std::string, uint64_t, bool, bool>, std::optional<SourceLine>>;
  const auto key =
      std::make_tuple(frame.module, frame.build_id, frame.module_offset, frame.symbol.empty(), frame.interrupted);
  auto found = lines->find(key);
  if (found == lines->end())
    found = lines->emplace(key, Resolve(*dw, ModuleFor(*dw, frame.module, frame.build_id), frame)).first;
  return found->second;
#else
  (void)frame;
  return std::nullopt;
#endif
}

void SetDebugFileDirectory(const std::string& directory) {
  std::lock_guard<std::mutex> lock(g_mu);
  *g_debug_directory = directory;
}

namespace {
void AddStack(const trace::Stack& s, SourceLines* lines) {
  for (const auto& f : s.native) {
    if (!lines->Seen(f)) lines->Set(f, SourceLineOf(f));
  }
}
}  // namespace

void SymbolizeReport(Report* report) {
  for (const auto& v : report->verdicts)
    for (const auto& e : v.evidence) {
      AddStack(e.current, &report->source_lines);
      for (const auto& t : e.other_threads) AddStack(t.stack, &report->source_lines);
      AddStack(e.callsite, &report->source_lines);
    }
  for (const auto& f : report->findings) AddStack(f.callsite, &report->source_lines);
  for (const auto& r : report->recovered_stalls)
    if (r.culprit) {
      AddStack(r.culprit->current, &report->source_lines);
      AddStack(r.culprit->callsite, &report->source_lines);
    }
}

SourceLines SymbolizeDump(const Dump& dump) {
  SourceLines lines;
  if (!dump.detail) return lines;
  for (const auto& t : dump.detail->threads) AddStack(t.stack, &lines);
  for (const auto& c : dump.detail->callsites) AddStack(c.stack, &lines);
  return lines;
}

}  // namespace analysis
}  // namespace ncclwatch
