// Linked into libncclwatch.so and the ncclwatch command when they carry their own C++ runtime
// (NCCLWATCH_STATIC_RUNTIME), so that the runtime does not raise the glibc they need.
//
// GCC's exception unwinder (libgcc_eh.a), when built against glibc 2.35 or newer, finds unwind
// tables with _dl_find_object, a glibc 2.35 function: linked in as it is, it would make the
// outputs refuse to load on glibc 2.34 (RHEL 9), although nothing else in them needs it. This
// hidden definition takes its place in our copy of the unwinder only (the application's own is
// untouched): the same answer, from dl_iterate_phdr, which is how libgcc found the tables before
// 2.35. It is only used when one of our own exceptions is thrown, so its cost does not matter.
#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstring>

// Only where the structure has no extra fields to fill (x86_64, aarch64; not i386 or arm32).
#if defined(DLFO_STRUCT_HAS_EH_DBASE) && !DLFO_STRUCT_HAS_EH_DBASE && !DLFO_STRUCT_HAS_EH_COUNT

namespace {

struct Search {
  uintptr_t pc;
  dl_find_object* out;
};

int Visit(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<Search*>(data);
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  const void* eh_frame = nullptr;
  bool inside = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD) {
      const uintptr_t end = start + ph.p_memsz;
      if (start < lo) lo = start;
      if (end > hi) hi = end;
      if (search->pc >= start && search->pc < end) inside = true;
    } else if (ph.p_type == PT_GNU_EH_FRAME) {
      eh_frame = reinterpret_cast<const void*>(start);
    }
  }
  if (!inside) return 0;
  std::memset(search->out, 0, sizeof *search->out);
  search->out->dlfo_map_start = reinterpret_cast<void*>(lo);
  search->out->dlfo_map_end = reinterpret_cast<void*>(hi);
  search->out->dlfo_eh_frame = const_cast<void*>(eh_frame);
  return 1;  // dlfo_link_map stays null: the unwinder reads only the unwind table
}

}  // namespace

extern "C" __attribute__((visibility("hidden"))) int _dl_find_object(void* pc, dl_find_object* out) noexcept {
  Search search{reinterpret_cast<uintptr_t>(pc), out};
  return dl_iterate_phdr(Visit, &search) ? 0 : -1;
}

#endif
