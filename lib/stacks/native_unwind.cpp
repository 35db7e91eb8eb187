#include "native_unwind.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

#include "stacks.h"

// Opens libunwind.so.8 where the library is built self-contained (unwind_loader.cpp); absent
// where libunwind is linked.
extern "C" __attribute__((weak, visibility("hidden"))) void ncclwatch_load_libunwind();

namespace ncclwatch {
namespace stacks {
namespace detail {
namespace {

bool g_native_unwind_works = false;  // written once, under g_prepare_mu, before g_prepared
std::atomic<bool> g_prepared{false};
std::mutex g_prepare_mu;

using AccessMem = int (*)(unw_addr_space_t, unw_word_t, unw_word_t*, int, void*);
AccessMem g_libunwind_access_mem = nullptr;

// The copy of a stack UnwindContextOverCopy reads from, for the unwind whose cursor (or
// context: whichever libunwind passes as the accessors' argument) is `key`.
struct StackCopy {
  std::atomic<const void*> key{nullptr};
  std::atomic<const void*> other_key{nullptr};
  uintptr_t base = 0;
  const unsigned char* data = nullptr;
  size_t size = 0;
};
StackCopy g_stack_copy;

// Reads one word of this process's memory, or fails on an address that is not readable
// (ReadOwnMemory: never through libunwind's own memory-check pipe).
int CheckedAccessMem(unw_addr_space_t as, unw_word_t addr, unw_word_t* val, int write, void* arg) {
  if (write) return g_libunwind_access_mem(as, addr, val, write, arg);
  // (libunwind passes the context, its low bit sometimes set as a flag, or the cursor)
  const void* key = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(arg) & ~uintptr_t{1});
  if (key != nullptr && (key == g_stack_copy.key.load(std::memory_order_acquire) ||
                         key == g_stack_copy.other_key.load(std::memory_order_acquire))) {
    const uintptr_t a = static_cast<uintptr_t>(addr);
    if (a >= g_stack_copy.base && a - g_stack_copy.base + sizeof *val <= g_stack_copy.size) {
      std::memcpy(val, g_stack_copy.data + (a - g_stack_copy.base), sizeof *val);
      return 0;
    }
  }
  return detail::ReadOwnMemory(static_cast<uintptr_t>(addr), val, sizeof *val) ? 0 : -UNW_EINVAL;
}

struct PipeSearch {
  uintptr_t inside;  // an address in libunwind's data
  int closed;
};

bool IsPipeEnd(int fd, int access, ino_t* inode) {
  struct stat st;
  if (fd < 3 || fd > 1 << 20 || fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) return false;
  const int flags = fcntl(fd, F_GETFL);
  *inode = st.st_ino;
  return flags >= 0 && (flags & O_ACCMODE) == access;
}

// libunwind opened its memory-check pipe while it initialized (just now) and keeps the two
// descriptors in a static int[2] in its writable data: found there as the read and the write
// end of one pipe, they are closed and the array reset to -1 (what libunwind holds before it
// opens it). CheckedAccessMem replaces the only reader of that array.
int FindValidationPipe(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<PipeSearch*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr, end = start + ph.p_memsz;
    if (search->inside < start || search->inside >= end) continue;
    if (!(ph.p_flags & PF_W)) return 0;
    for (uintptr_t a = (start + 3) & ~uintptr_t{3}; a + 2 * sizeof(int) <= end; a += sizeof(int)) {
      int* pair = reinterpret_cast<int*>(a);
      ino_t read_inode = 0, write_inode = 0;
      if (pair[0] < 3 || pair[1] < 3 || pair[0] == pair[1]) continue;
      if (!IsPipeEnd(pair[0], O_RDONLY, &read_inode) || !IsPipeEnd(pair[1], O_WRONLY, &write_inode) ||
          read_inode != write_inode)
        continue;
      const int fds[2] = {pair[0], pair[1]};
      pair[0] = pair[1] = -1;
      close(fds[0]);
      close(fds[1]);
      ++search->closed;
    }
    return 1;
  }
  return 0;
}

}  // namespace

// Once, under g_prepare_mu.
static void PrepareUnwinderOnce() {
  // Where libunwind is opened at run time, it is opened now: a process that never starts
  // ncclwatch maps no libunwind (nor its liblzma).
  if (ncclwatch_load_libunwind) ncclwatch_load_libunwind();
  // libunwind initializes itself on first use without full synchronization (ThreadSanitizer
  // reports it when threads start unwinding together), and that first use should not be in a
  // signal handler: here, before ncclwatch unwinds anything.
  unw_context_t context;
  uintptr_t ips[2];
  // Where libunwind was not found (the self-contained build opens it at run time) both calls
  // fail: that is what NativeStackProblem reports.
  g_native_unwind_works = unw_getcontext(&context) == 0 && UnwindContext(&context, /*signal_frame=*/false, ips, 2) > 0;
  if (!g_native_unwind_works) return;
  unw_accessors_t* acc = unw_get_accessors(unw_local_addr_space);
  if (acc && acc->access_mem && acc->access_mem != &CheckedAccessMem) {
    g_libunwind_access_mem = acc->access_mem;
    acc->access_mem = &CheckedAccessMem;
    PipeSearch search{reinterpret_cast<uintptr_t>(unw_local_addr_space), 0};
    dl_iterate_phdr(&FindValidationPipe, &search);
  }
}

}  // namespace detail

void PrepareUnwinder() {
  if (detail::g_prepared.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(detail::g_prepare_mu);
  if (detail::g_prepared.load(std::memory_order_relaxed)) return;
  detail::PrepareUnwinderOnce();
  detail::g_prepared.store(true, std::memory_order_release);
}

namespace detail {

int UnwindContext(unw_context_t* context, bool signal_frame, uintptr_t* out, int max) {
  unw_cursor_t cursor;
  const int init = signal_frame ? unw_init_local2(&cursor, context, UNW_INIT_SIGNAL_FRAME)
                                : unw_init_local(&cursor, context);
  if (init < 0) return 0;
  int count = 0;
  while (count < max) {
    unw_word_t ip;
    if (unw_get_reg(&cursor, UNW_REG_IP, &ip) < 0 || ip == 0) break;
    out[count++] = static_cast<uintptr_t>(ip);
    if (unw_step(&cursor) <= 0) break;
  }
  return count;
}

int UnwindContextOverCopy(unw_context_t* context, bool signal_frame, uintptr_t* out, int max, uintptr_t base,
                          const void* copy, size_t size) {
  unw_cursor_t cursor;
  g_stack_copy.base = base;
  g_stack_copy.data = static_cast<const unsigned char*>(copy);
  g_stack_copy.size = size;
  g_stack_copy.other_key.store(context, std::memory_order_release);
  g_stack_copy.key.store(&cursor, std::memory_order_release);
  const int init = signal_frame ? unw_init_local2(&cursor, context, UNW_INIT_SIGNAL_FRAME)
                                : unw_init_local(&cursor, context);
  int count = 0;
  while (init >= 0 && count < max) {
    unw_word_t ip;
    if (unw_get_reg(&cursor, UNW_REG_IP, &ip) < 0 || ip == 0) break;
    out[count++] = static_cast<uintptr_t>(ip);
    if (unw_step(&cursor) <= 0) break;
  }
  g_stack_copy.key.store(nullptr, std::memory_order_release);
  g_stack_copy.other_key.store(nullptr, std::memory_order_release);
  return count;
}

// The kernel checks the addresses (process_vm_readv on ourselves), with no file descriptor:
// libunwind's own check writes doubted addresses into a pipe it keeps open for good, and once the
// application closed that pipe's descriptors and opened files of its own under the same
// numbers, the check read from and wrote raw memory into the application's files.
bool ReadOwnMemory(uintptr_t address, void* out, size_t size) {
  iovec local{out, size};
  iovec remote{reinterpret_cast<void*>(address), size};
  const int saved_errno = errno;
  const ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  const int why = errno;
  errno = saved_errno;
  if (n == static_cast<ssize_t>(size)) return true;
  if (n >= 0 || why == EFAULT) return false;
  // Not allowed here (a seccomp filter): every page must at least be mapped; then a plain copy.
  constexpr uintptr_t kPageMask = ~static_cast<uintptr_t>(4095);
  for (uintptr_t page = address & kPageMask; page < address + size; page += 4096) {
    if (msync(reinterpret_cast<void*>(page), 4096, MS_ASYNC) != 0) {
      errno = saved_errno;
      return false;
    }
  }
  errno = saved_errno;
  std::memcpy(out, reinterpret_cast<const void*>(address), size);
  return true;
}

int FindFrame(const uintptr_t* ips, int count, uintptr_t ip, int window) {
  for (int i = 0; i < count && i < window; ++i) {
    if (ips[i] == ip) return i;
  }
  return -1;
}

}  // namespace detail

std::string NativeStackProblem() {
  PrepareUnwinder();
  if (detail::g_native_unwind_works) return {};
  return "libunwind.so.8 is not usable in this process (Debian/Ubuntu package libunwind8): call sites and "
         "thread stacks have Python frames only";
}

}  // namespace stacks
}  // namespace ncclwatch
