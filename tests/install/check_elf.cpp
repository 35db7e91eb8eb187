// Reads an ELF shared object or program (64-bit, this machine's byte order) and checks what it
// asks of the system where it is loaded:
//   --only-glibc        every DT_NEEDED entry is one of glibc's own libraries, and no symbol
//                       version is needed from the C++ runtime (GLIBCXX_, CXXABI_) or libgcc_s
//   --forbid-import SYM SYM is not imported (repeatable)
//   --nccl-exports      every exported symbol is a function of the NCCL API list
//                       (include/ncclwatch/nccl_abi.h), a process ending (_exit, _Exit,
//                       quick_exit, the exec family: lib/libncclwatch.map) or starts with
//                       ncclwatch_, and every one of the list and of the endings is exported
// Always prints the NEEDED entries, the versions needed and the highest GLIBC_ version needed.
// Exit status 0 when every requested check passed, 1 otherwise, 2 for an unreadable file.
#include <elf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "ncclwatch/nccl_abi.h"

namespace {

const std::set<std::string> kGlibcLibraries = {"libc.so.6",       "libm.so.6",            "libdl.so.2",
                                               "libpthread.so.0", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"};

std::set<std::string> NcclApi() {
  std::set<std::string> names;
#define NAME_OPERATION(name, kind, params, args, c, d, r, p) names.insert(#name);
#define NAME_FUNCTION(ret, name, params, args, ...) names.insert(#name);
  NCCLWATCH_FOR_EACH_OPERATION(NAME_OPERATION)
  NCCLWATCH_FOR_EACH_MANAGED(NAME_FUNCTION)
  NCCLWATCH_FOR_EACH_PASSTHROUGH(NAME_FUNCTION)
#undef NAME_OPERATION
#undef NAME_FUNCTION
  return names;
}

struct Elf {
  std::vector<char> bytes;
  const Elf64_Ehdr* header() const { return reinterpret_cast<const Elf64_Ehdr*>(bytes.data()); }
  const Elf64_Shdr* section(size_t i) const {
    return reinterpret_cast<const Elf64_Shdr*>(bytes.data() + header()->e_shoff + i * header()->e_shentsize);
  }
  bool InFile(uint64_t offset, uint64_t size) const { return offset <= bytes.size() && size <= bytes.size() - offset; }
  const char* String(const Elf64_Shdr* strtab, uint64_t offset) const {
    if (offset >= strtab->sh_size || !InFile(strtab->sh_offset, strtab->sh_size)) return "";
    return bytes.data() + strtab->sh_offset + offset;
  }
  template <typename T>
  const T* At(uint64_t offset) const {
    return InFile(offset, sizeof(T)) ? reinterpret_cast<const T*>(bytes.data() + offset) : nullptr;
  }
};

bool Load(const char* path, Elf* elf, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return *error = "cannot open", false;
  elf->bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  const Elf64_Ehdr* h = elf->header();
  if (elf->bytes.size() < sizeof(Elf64_Ehdr) || std::memcmp(h->e_ident, ELFMAG, SELFMAG) != 0)
    return *error = "not an ELF file", false;
  if (h->e_ident[EI_CLASS] != ELFCLASS64) return *error = "not a 64-bit ELF file", false;
  if (h->e_shentsize != sizeof(Elf64_Shdr) || !elf->InFile(h->e_shoff, uint64_t{h->e_shnum} * h->e_shentsize))
    return *error = "no readable section headers", false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  bool only_glibc = false, nccl_exports = false;
  std::vector<std::string> forbidden;
  const char* path = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--only-glibc") == 0) only_glibc = true;
    else if (std::strcmp(argv[i], "--nccl-exports") == 0) nccl_exports = true;
    else if (std::strcmp(argv[i], "--forbid-import") == 0 && i + 1 < argc) forbidden.push_back(argv[++i]);
    else if (argv[i][0] != '-' && !path) path = argv[i];
    else {
      std::fprintf(stderr, "usage: check_elf [--only-glibc] [--nccl-exports] [--forbid-import SYM]... FILE\n");
      return 2;
    }
  }
  if (!path) return std::fprintf(stderr, "check_elf: no file given\n"), 2;
  Elf elf;
  std::string error;
  if (!Load(path, &elf, &error)) return std::fprintf(stderr, "check_elf: %s: %s\n", path, error.c_str()), 2;

  std::vector<std::string> needed, versions, exported, imported;
  bool have_dynsym = false;
  for (size_t i = 0; i < elf.header()->e_shnum; ++i) {
    const Elf64_Shdr* s = elf.section(i);
    if (s->sh_link >= elf.header()->e_shnum) continue;
    const Elf64_Shdr* strtab = elf.section(s->sh_link);
    if (s->sh_type == SHT_DYNAMIC) {
      for (uint64_t off = s->sh_offset; off + sizeof(Elf64_Dyn) <= s->sh_offset + s->sh_size; off += sizeof(Elf64_Dyn)) {
        const Elf64_Dyn* d = elf.At<Elf64_Dyn>(off);
        if (!d || d->d_tag == DT_NULL) break;
        if (d->d_tag == DT_NEEDED) needed.push_back(elf.String(strtab, d->d_un.d_val));
      }
    } else if (s->sh_type == SHT_DYNSYM) {
      have_dynsym = true;
      for (uint64_t off = s->sh_offset + sizeof(Elf64_Sym); off + sizeof(Elf64_Sym) <= s->sh_offset + s->sh_size;
           off += sizeof(Elf64_Sym)) {
        const Elf64_Sym* sym = elf.At<Elf64_Sym>(off);
        if (!sym) break;
        const int bind = ELF64_ST_BIND(sym->st_info), type = ELF64_ST_TYPE(sym->st_info);
        if (bind == STB_LOCAL || type == STT_SECTION || type == STT_FILE) continue;
        const std::string name = elf.String(strtab, sym->st_name);
        if (name.empty()) continue;
        // GLOBAL, WEAK and GNU_UNIQUE alike: whatever another object could bind to.
        (sym->st_shndx == SHN_UNDEF ? imported : exported).push_back(name);
      }
    } else if (s->sh_type == SHT_GNU_verneed) {
      uint64_t off = s->sh_offset;
      for (uint32_t n = 0; n < s->sh_info; ++n) {
        const Elf64_Verneed* vn = elf.At<Elf64_Verneed>(off);
        if (!vn) break;
        const std::string file = elf.String(strtab, vn->vn_file);
        uint64_t aux_off = off + vn->vn_aux;
        for (uint16_t a = 0; a < vn->vn_cnt; ++a) {
          const Elf64_Vernaux* aux = elf.At<Elf64_Vernaux>(aux_off);
          if (!aux) break;
          versions.push_back(std::string(elf.String(strtab, aux->vna_name)) + " (" + file + ")");
          if (!aux->vna_next) break;
          aux_off += aux->vna_next;
        }
        if (!vn->vn_next) break;
        off += vn->vn_next;
      }
    }
  }

  int failures = 0, checks = 0;
  auto fail = [&](const std::string& what) {
    std::printf("FAIL: %s\n", what.c_str());
    ++failures;
  };

  std::printf("%s\n  needed:", path);
  for (const auto& n : needed) std::printf(" %s", n.c_str());
  std::printf("\n  versions needed:");
  int best_minor = -1, best_major = -1;
  for (const auto& v : versions) {
    std::printf(" %s", v.c_str());
    int major = 0, minor = 0;
    if (std::sscanf(v.c_str(), "GLIBC_%d.%d", &major, &minor) == 2 &&
        (major > best_major || (major == best_major && minor > best_minor))) {
      best_major = major;
      best_minor = minor;
    }
  }
  if (best_major >= 0) std::printf("\n  highest glibc version needed: GLIBC_%d.%d", best_major, best_minor);
  std::printf("\n  %zu exported, %zu imported symbols\n", exported.size(), imported.size());

  if (only_glibc) {
    ++checks;
    for (const auto& n : needed)
      if (!kGlibcLibraries.count(n)) fail("needs " + n + ", which is not part of glibc");
    for (const auto& v : versions)
      if (v.rfind("GLIBCXX_", 0) == 0 || v.rfind("CXXABI_", 0) == 0 || v.rfind("GCC_", 0) == 0)
        fail("needs the C++ runtime's or libgcc's symbol version " + v);
  }
  for (const auto& f : forbidden) {
    ++checks;
    if (std::find(imported.begin(), imported.end(), f) != imported.end()) fail("imports " + f);
  }
  if (nccl_exports) {
    ++checks;
    if (!have_dynsym) fail("no dynamic symbol table");
    const std::set<std::string> api = NcclApi();
    // The ways a rank may leave without exit()'s handlers, which its black box must know of.
    const std::set<std::string> process_exit = {"_exit",  "_Exit",   "quick_exit", "execve", "execv",
                                                "execvp", "execvpe", "execveat",   "fexecve", "execl",
                                                "execlp", "execle"};
    for (const auto& e : exported)
      if (!api.count(e) && !process_exit.count(e) && e.rfind("ncclwatch_", 0) != 0)
        fail("exports " + e + ", which is not an NCCL API function");
    for (const auto& e : process_exit)
      if (std::find(exported.begin(), exported.end(), e) == exported.end()) fail("does not export " + e);
    for (const auto& a : api)
      if (std::find(exported.begin(), exported.end(), a) == exported.end()) fail("does not export " + a);
  }
  std::printf("%s: %d check(s), %d problem(s)\n", failures ? "FAILED" : "ok", checks, failures);
  return failures ? 1 : 0;
}
