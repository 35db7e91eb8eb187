#define UNW_LOCAL_ONLY
#include <dlfcn.h>
#include <elf.h>
#include <libunwind.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "common/process_info.h"
#include "format/demangle.h"
#include "format/hex.h"
#include "stacks.h"

namespace ncclwatch {
namespace stacks {
namespace {

// The loaded object holding an address, from the loader's own list.
struct Module {
  uintptr_t bias = 0;  // dlpi_addr: ELF virtual address + bias = run-time address
  std::string path;    // empty for the main program (dlpi_name "")
  std::string build_id;
};

// NT_GNU_BUILD_ID from the object's PT_NOTE segments (mapped: they lie in its first PT_LOAD).
std::string BuildIdOf(const dl_phdr_info* info) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_NOTE) continue;
    const auto* p = reinterpret_cast<const unsigned char*>(info->dlpi_addr + segment.p_vaddr);
    const unsigned char* end = p + segment.p_memsz;
    const size_t align = segment.p_align == 8 ? 8 : 4;
    const auto up = [align](size_t n) { return (n + align - 1) & ~(align - 1); };
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      ElfW(Nhdr) note;
      std::memcpy(&note, p, sizeof note);
      const unsigned char* name = p + sizeof note;
      const unsigned char* desc = name + up(note.n_namesz);
      if (desc + note.n_descsz > end) break;
      if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0)
        return trace::HexBytes(desc, note.n_descsz);
      p = desc + up(note.n_descsz);
    }
  }
  return std::string();
}

// The module whose PT_LOAD segments contain `address`; build ids are cached per module.
bool FindModule(uintptr_t address, Module* out) {
  struct Search {
    uintptr_t address;
    bool found;
    Module* out;
  } search{address, false, out};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        auto* s = static_cast<Search*>(arg);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          const uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
          if (segment.p_type != PT_LOAD || s->address < begin || s->address >= begin + segment.p_memsz) continue;
          s->out->bias = info->dlpi_addr;
          s->out->path = info->dlpi_name != nullptr ? info->dlpi_name : "";
          // Read while the loader lock is held: the object cannot be unloaded meanwhile.
          static std::mutex* mu = new std::mutex;
          static auto* ids = new std::map<std::pair<uintptr_t, std::string>, std::string>;
          std::lock_guard<std::mutex> lock(*mu);
          auto key = std::make_pair(s->out->bias, s->out->path);
          auto found = ids->find(key);
          if (found == ids->end()) found = ids->emplace(key, BuildIdOf(info)).first;
          s->out->build_id = found->second;
          s->found = true;
          return 1;
        }
        return 0;
      },
      &search);
  return search.found;
}

// The main program's path, read once (leaked: usable at exit): the loader names it "" and
// dladdr argv[0].
const std::string& MainProgramPath() {
  static const std::string* path = new std::string(ExecutablePath());
  return *path;
}

// The start of the function holding `pc` according to the unwind tables (.eh_frame), 0 when
// none covers it.
uintptr_t UnwindFunctionStart(uintptr_t pc) {
  unw_accessors_t* acc = unw_get_accessors(unw_local_addr_space);
  if (acc == nullptr || acc->find_proc_info == nullptr) return 0;
  unw_proc_info_t info;
  std::memset(&info, 0, sizeof info);
  if (acc->find_proc_info(unw_local_addr_space, pc, &info, /*need_unwind_info=*/0, nullptr) != 0) return 0;
  return pc >= info.start_ip && pc < info.end_ip ? static_cast<uintptr_t>(info.start_ip) : 0;
}

NativeFrame Lookup(uintptr_t ip, bool interrupted) {
  NativeFrame frame;
  frame.ip = ip;
  frame.interrupted = interrupted;
  if (ip == 0) return frame;
  // ip - 1: a return address can be the first byte after the function that made the call. An
  // interrupted instruction is its own address (a fault on a function's first byte).
  const uintptr_t pc = interrupted ? ip : ip - 1;
  Dl_info info;
  void* symbol_entry = nullptr;  // the ElfW(Sym) of dli_sname
  if (dladdr1(reinterpret_cast<void*>(pc), &info, &symbol_entry, RTLD_DL_SYMENT) == 0) return frame;
  const auto* symbol = static_cast<const ElfW(Sym)*>(symbol_entry);
  Module module;
  if (FindModule(pc, &module)) {
    frame.module = module.path.empty() ? MainProgramPath() : module.path;
    frame.build_id = module.build_id;
    frame.module_offset = ip - module.bias;
  } else if (info.dli_fname != nullptr) {
    frame.module = info.dli_fname;
  }
  // dladdr gives the nearest exported symbol at or below pc, however far: a name only when pc
  // lies inside it (its size, or for a symbol without one, a function starting right there).
  if (info.dli_sname != nullptr && info.dli_saddr != nullptr) {
    const auto start = reinterpret_cast<uintptr_t>(info.dli_saddr);
    const bool inside = symbol != nullptr && symbol->st_size > 0 ? pc < start + symbol->st_size
                                                                   : UnwindFunctionStart(pc) == start;
    if (inside) {
      frame.symbol = trace::Demangle(info.dli_sname);
      frame.offset = ip - start;
      return frame;
    }
  }
  // dladdr sees exported symbols only; libunwind reads the object's full symbol table
  // (.symtab), which names static and hidden functions too when the file is not stripped. It
  // too takes the nearest symbol, so its name counts only when the unwind tables say a
  // function starts exactly there.
  char name[512];
  unw_word_t off = 0;
  unw_accessors_t* acc = unw_get_accessors(unw_local_addr_space);
  if (acc && acc->get_proc_name && acc->get_proc_name(unw_local_addr_space, pc, name, sizeof name, &off, nullptr) == 0 &&
      name[0] && UnwindFunctionStart(pc) == pc - off) {
    frame.symbol = trace::Demangle(name);
    frame.offset = ip - (pc - off);
    return frame;
  }
  frame.offset = ip - reinterpret_cast<uintptr_t>(info.dli_fbase);
  return frame;
}

}  // namespace

std::vector<LoadedModule> LoadedModules() {
  std::vector<LoadedModule> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        LoadedModule m;
        m.bias = info->dlpi_addr;
        m.lo = UINTPTR_MAX;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          if (segment.p_type != PT_LOAD) continue;
          m.lo = std::min<uintptr_t>(m.lo, info->dlpi_addr + segment.p_vaddr);
          m.hi = std::max<uintptr_t>(m.hi, info->dlpi_addr + segment.p_vaddr + segment.p_memsz);
        }
        if (m.hi == 0) return 0;
        m.path = info->dlpi_name != nullptr && info->dlpi_name[0] ? info->dlpi_name : MainProgramPath();
        if (m.path.empty() || m.path.compare(0, 5, "linux") == 0) return 0;  // the vDSO: no file
        m.build_id = BuildIdOf(info);
        static_cast<std::vector<LoadedModule>*>(arg)->push_back(std::move(m));
        return 0;
      },
      &out);
  for (LoadedModule& m : out) m.own = IsOwnFrame(m.lo + 1) || IsOwnFrame((m.lo + m.hi) / 2);
  return out;
}

uint64_t ModulesGeneration() {
  uint64_t generation = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* arg) {
        if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
          *static_cast<uint64_t*>(arg) = info->dlpi_adds * 0x9e3779b97f4a7c15ull + info->dlpi_subs;
        return 1;
      },
      &generation);
  return generation;
}

NativeFrame Symbolize(uintptr_t ip, bool interrupted) {
  PrepareUnwinder();
  // Leaked on purpose: dumps can run while the process exits, after static destructors.
  static std::mutex* mu = new std::mutex;
  static auto* cache = new std::unordered_map<uintptr_t, NativeFrame>;
  // User-space addresses leave the top bit clear: it tells the two lookups of one address apart.
  const uintptr_t key = ip | (interrupted ? uintptr_t{1} << (sizeof(uintptr_t) * 8 - 1) : 0);
  {
    std::lock_guard<std::mutex> lock(*mu);
    const auto found = cache->find(key);
    if (found != cache->end()) return found->second;
  }
  NativeFrame frame = Lookup(ip, interrupted);  // dladdr takes the loader lock: not under ours
  std::lock_guard<std::mutex> lock(*mu);
  return cache->emplace(key, std::move(frame)).first->second;
}

}  // namespace stacks
}  // namespace ncclwatch
