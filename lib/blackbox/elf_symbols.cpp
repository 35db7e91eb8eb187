#include "blackbox/elf_symbols.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "format/demangle.h"
#include "format/hex.h"

namespace ncclwatch {
namespace blackbox {
namespace {

constexpr uint64_t kMaxFileBytes = uint64_t{4} << 30;
constexpr uint64_t kMaxSymbols = 10000000;

// A read-only mapping of a whole file, unmapped when it goes.
struct Mapped {
  const unsigned char* p = nullptr;
  uint64_t size = 0;
  ~Mapped() {
    if (p) munmap(const_cast<unsigned char*>(p), size);
  }
  bool Has(uint64_t offset, uint64_t bytes) const { return offset <= size && bytes <= size - offset; }
};


// The NT_GNU_BUILD_ID of a note section's bytes, "" none.
std::string BuildIdIn(const unsigned char* p, uint64_t size) {
  uint64_t at = 0;
  while (at + sizeof(Elf64_Nhdr) <= size) {
    Elf64_Nhdr note;
    std::memcpy(&note, p + at, sizeof note);
    const uint64_t name = at + sizeof note, desc = name + ((note.n_namesz + 3) & ~3u);
    if (desc > size || note.n_descsz > size - desc) break;
    if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(p + name, "GNU", 4) == 0)
      return trace::HexBytes(p + desc, note.n_descsz);
    at = desc + ((note.n_descsz + 3) & ~3u);
  }
  return std::string();
}

}  // namespace

std::map<uint64_t, ElfFunction> FunctionsAt(const std::string& path, const std::string& build_id,
                                           std::vector<uint64_t> addresses) {
  std::map<uint64_t, ElfFunction> out;
  std::sort(addresses.begin(), addresses.end());
  addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
  if (addresses.empty()) return out;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  struct stat st;
  Mapped m;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && static_cast<uint64_t>(st.st_size) <= kMaxFileBytes) {
    void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
      m.p = static_cast<const unsigned char*>(p);
      m.size = static_cast<uint64_t>(st.st_size);
    }
  }
  close(fd);
  if (!m.p || !m.Has(0, sizeof(Elf64_Ehdr)) || std::memcmp(m.p, ELFMAG, SELFMAG) != 0 || m.p[EI_CLASS] != ELFCLASS64)
    return out;
  Elf64_Ehdr eh;
  std::memcpy(&eh, m.p, sizeof eh);
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || !m.Has(eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr))) return out;
  std::vector<Elf64_Shdr> sections(eh.e_shnum);
  if (eh.e_shnum) std::memcpy(sections.data(), m.p + eh.e_shoff, eh.e_shnum * sizeof(Elf64_Shdr));
  std::string file_id;
  const Elf64_Shdr* symtab = nullptr;
  const Elf64_Shdr* dynsym = nullptr;
  for (const Elf64_Shdr& s : sections) {
    if (s.sh_type == SHT_NOTE && file_id.empty() && m.Has(s.sh_offset, s.sh_size)) file_id = BuildIdIn(m.p + s.sh_offset, s.sh_size);
    if (s.sh_type == SHT_SYMTAB) symtab = &s;
    if (s.sh_type == SHT_DYNSYM) dynsym = &s;
  }
  if (!build_id.empty() && file_id != build_id) return out;  // another build: its names could lie
  const Elf64_Shdr* table = symtab ? symtab : dynsym;
  if (!table || table->sh_entsize != sizeof(Elf64_Sym) || table->sh_link >= sections.size() ||
      !m.Has(table->sh_offset, table->sh_size))
    return out;
  const Elf64_Shdr& strings = sections[table->sh_link];
  if (!m.Has(strings.sh_offset, strings.sh_size)) return out;
  // For each address, the function covering it whose start is nearest (a symbol without a size
  // covers its first byte only).
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> best;  // address -> (start, name offset)
  const uint64_t count = std::min<uint64_t>(table->sh_size / sizeof(Elf64_Sym), kMaxSymbols);
  for (uint64_t i = 0; i < count; ++i) {
    Elf64_Sym sym;
    std::memcpy(&sym, m.p + table->sh_offset + i * sizeof sym, sizeof sym);
    if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || sym.st_value == 0 || sym.st_name >= strings.sh_size) continue;
    const uint64_t end = sym.st_value + std::max<uint64_t>(sym.st_size, 1);
    for (auto it = std::lower_bound(addresses.begin(), addresses.end(), sym.st_value);
         it != addresses.end() && *it < end; ++it) {
      auto& b = best[*it];
      if (b.first == 0 || sym.st_value > b.first) b = {sym.st_value, sym.st_name};
    }
  }
  for (const auto& [address, found] : best) {
    const char* name = reinterpret_cast<const char*>(m.p + strings.sh_offset + found.second);
    const size_t len = strnlen(name, strings.sh_size - found.second);
    if (len == 0 || len == strings.sh_size - found.second) continue;  // empty, or not terminated in the table
    out[address] = {trace::Demangle(std::string(name, len).c_str()), found.first};
  }
  return out;
}

}  // namespace blackbox
}  // namespace ncclwatch
