#include "native_unwind.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "stacks.h"
#include "testing.h"

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

// How ReadOwnMemory reads, decided once before ncclwatch's first read (DecideReadPath).
enum ReadPath : int {
  kUndecided = 0,
  kKernelCopy,   // process_vm_readv: the kernel checks every byte, nothing can fault
  kCheckedCopy,  // the call is refused (a seccomp filter): each page's readability, then a copy
  kNoRead,       // refused, and no check works here either: nothing is read
};
std::atomic<int> g_read_path{kUndecided};
// What the filter does with the call, for MemoryReadProblem; written before g_read_path.
char g_refusal[96];

// The kernel's sigset_t (what rt_sigprocmask copies): 8 bytes where there are 64 signals.
constexpr size_t kKernelSigsetBytes = (NSIG - 1) / 8;
constexpr uintptr_t kCheckPage = 4096;  // the smallest page: a larger one is checked more often

// Whether the kKernelSigsetBytes at `address` (aligned, inside one page) can be read, without
// touching them: rt_sigprocmask copies its new set from the caller's memory before it looks at
// `how` (the copy fails with EFAULT on an unmapped or PROT_NONE page, or one past the end of its
// file), and an invalid `how` then fails with EINVAL and changes no mask. No file descriptor,
// async-signal-safe; callers keep errno.
bool WordReadable(uintptr_t address) {
  return syscall(SYS_rt_sigprocmask, -1, address, nullptr, kKernelSigsetBytes) != 0 && errno == EINVAL;
}

// Copies after a readability check of each page of [address, address + size). The check and
// the copy are two steps: a page unmapped between them by another thread would still fault,
// so this is only used where process_vm_readv is refused. A plain loop, not memcpy: the
// sanitizers would take a read of another thread's stack (its redzones) for a bug of ours.
__attribute__((no_sanitize("address", "thread"))) bool CheckedCopy(uintptr_t address, void* out, size_t size) {
  if (size == 0) return true;
  if (address + size < address) return false;
  for (uintptr_t page = address & ~(kCheckPage - 1); page < address + size; page += kCheckPage) {
    const uintptr_t word = std::max(page, address) & ~uintptr_t{7};
    if (!WordReadable(word)) return false;
  }
  const volatile unsigned char* from = reinterpret_cast<const volatile unsigned char*>(address);
  unsigned char* to = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < size; ++i) to[i] = from[i];
  return true;
}

// Whether the check answers as it should here (a PROT_NONE page: no; a local: yes). Where it
// does not (an emulated kernel), nothing is read.
bool CheckWorks() {
  void* none = mmap(nullptr, kCheckPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (none == MAP_FAILED) return false;
  alignas(8) uint64_t local[1] = {0};
  const bool works = !WordReadable(reinterpret_cast<uintptr_t>(none)) && WordReadable(reinterpret_cast<uintptr_t>(local));
  munmap(none, kCheckPage);
  return works;
}

// A system call that leaves errno alone: the probe's child shares this process's memory, the
// calling thread's errno included. Sanitizer builds do not probe (their runtimes take a clone
// sharing the memory for a thread of theirs, and the child crashes): a filter is taken as refusing.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kCanProbe = false;
long RawSyscall(long, long = 0, long = 0, long = 0, long = 0, long = 0, long = 0) { return -ENOSYS; }
#elif defined(__x86_64__)
constexpr bool kCanProbe = true;
long RawSyscall(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0, long f = 0) {
  register long r10 asm("r10") = d;
  register long r8 asm("r8") = e;
  register long r9 asm("r9") = f;
  long ret;
  asm volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9) : "rcx", "r11", "memory");
  return ret;
}
#elif defined(__aarch64__)
constexpr bool kCanProbe = true;
long RawSyscall(long n, long a = 0, long b = 0, long c = 0, long d = 0, long e = 0, long f = 0) {
  register long x8 asm("x8") = n;
  register long x0 asm("x0") = a;
  register long x1 asm("x1") = b;
  register long x2 asm("x2") = c;
  register long x3 asm("x3") = d;
  register long x4 asm("x4") = e;
  register long x5 asm("x5") = f;
  asm volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5) : "memory");
  return x0;
}
#else
constexpr bool kCanProbe = false;
long RawSyscall(long, long = 0, long = 0, long = 0, long = 0, long = 0, long = 0) { return -ENOSYS; }
#endif

struct KernelSigaction {  // rt_sigaction's own layout
  void (*handler)(int);
  unsigned long flags;
  void (*restorer)();
  uint64_t mask;
};

// The probe's child: a process of its own sharing this one's memory (no page-table copy, which
// takes a fork about 150 ms per GiB resident), on its own stack, making raw system calls only:
// SIGSYS to its default action and unblocked (the application's handlers are never run in
// it), no core file (RLIMIT_CORE 1: the kernel then writes none, to a file or a pipe), then
// the call once, and its end. Exit status 0: the call works; 1 + errno: refused with that errno.
__attribute__((no_sanitize("address", "thread"))) int ProbeChild(void*) {
  KernelSigaction dfl{};
  dfl.handler = SIG_DFL;
  RawSyscall(SYS_rt_sigaction, SIGSYS, reinterpret_cast<long>(&dfl), 0, kKernelSigsetBytes);
  uint64_t mask = ~(uint64_t{1} << (SIGSYS - 1));
  RawSyscall(SYS_rt_sigprocmask, SIG_SETMASK, reinterpret_cast<long>(&mask), 0, kKernelSigsetBytes);
  const rlimit no_core{1, 1};
  RawSyscall(SYS_prlimit64, 0, RLIMIT_CORE, reinterpret_cast<long>(&no_core), 0);
  volatile uint64_t word = 0x5ecc0bb5ecc0bbull;
  uint64_t copy = 0;
  iovec local{&copy, sizeof copy};
  iovec remote{const_cast<uint64_t*>(&word), sizeof word};
  const long n = RawSyscall(SYS_process_vm_readv, RawSyscall(SYS_getpid), reinterpret_cast<long>(&local), 1,
                            reinterpret_cast<long>(&remote), 1, 0);
  const long status = n == static_cast<long>(sizeof copy) && copy == word ? 0 : n < 0 ? 1 + std::min(-n, 200L) : 1;
  RawSyscall(SYS_exit_group, status);
  return 0;
}

const char* ErrnoName(int e) {
  switch (e) {
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case ENOSYS: return "ENOSYS";
    default: return "an error";
  }
}

// Before Linux 5.16, a process killed with a core-dumping signal (a filter's SIGSYS) took every
// process sharing its memory with it: the probe's child would take this one.
bool ChildDiesAlone() {
  utsname u;
  int major = 0, minor = 0;
  return uname(&u) == 0 && std::sscanf(u.release, "%d.%d", &major, &minor) == 2 &&
         (major > 5 || (major == 5 && minor >= 16));
}

// Under a seccomp filter, whether process_vm_readv works, found out in a child that makes the
// call once (ProbeChild): a filter that kills or traps then kills the child, never this process.
// The child sends no SIGCHLD (only a wait for clone children sees it, not the application's
// wait()), runs no atfork handler, and gets 2 s (a filter that waits for a supervisor's answer).
// `why` says what the filter does.
bool ProcessVmReadvWorks(char* why, size_t why_size) {
  if (!kCanProbe || !ChildDiesAlone()) {
    std::snprintf(why, why_size, "whether it allows the call is not tried here");
    return false;
  }
  constexpr size_t kStack = 64 * 1024;
  void* stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) {
    std::snprintf(why, why_size, "it could not be tried in a child");
    return false;
  }
  const pid_t pid = clone(&ProbeChild, static_cast<char*>(stack) + kStack, CLONE_VM, nullptr);
  if (pid < 0) {
    munmap(stack, kStack);
    std::snprintf(why, why_size, "it could not be tried in a child");
    return false;
  }
  int status = 0;
  pid_t waited = 0;
  long nap_ns = 20000, slept_ns = 0;
  while ((waited = waitpid(pid, &status, __WALL | WNOHANG)) == 0 && slept_ns < 2000000000L) {
    timespec nap{0, nap_ns};
    nanosleep(&nap, nullptr);
    slept_ns += nap_ns;
    nap_ns = std::min(nap_ns * 2, 10000000L);
  }
  if (waited == 0) {
    kill(pid, SIGKILL);
    while ((waited = waitpid(pid, &status, __WALL)) < 0 && errno == EINTR) {
    }
    status = -1;
  }
  if (waited == pid) munmap(stack, kStack);  // else the child may still run on it: kept
  if (waited != pid) {
    std::snprintf(why, why_size, "its child could not be waited for");
    return false;
  }
  if (status == -1) {
    std::snprintf(why, why_size, "it did not return in a child within 2 s");
    return false;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS)
    std::snprintf(why, why_size, "it kills or traps the caller with SIGSYS");
  else if (WIFSIGNALED(status))
    std::snprintf(why, why_size, "the child trying it got signal %d", WTERMSIG(status));
  else
    std::snprintf(why, why_size, "it fails with %s", ErrnoName(WEXITSTATUS(status) - 1));
  return false;
}

// Once, before the first read (PrepareUnwinder, at ncclwatch's start on the thread of the first
// NCCL call, whose filters the threads started later inherit). Without a filter (the common
// case) one prctl; with one, a child tries the call (well under a millisecond).
void DecideReadPath() {
  const int saved_errno = errno;
  int path = kKernelCopy;
  if (prctl(PR_GET_SECCOMP, 0, 0, 0, 0) > 0 && !ProcessVmReadvWorks(g_refusal, sizeof g_refusal))
    path = CheckWorks() ? kCheckedCopy : kNoRead;
  g_read_path.store(path, std::memory_order_release);
  errno = saved_errno;
}

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
  // How memory is read, before anything reads it (unwinding, Python frames).
  DecideReadPath();
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
// numbers, the check read from and wrote raw memory into the application's files. Where a
// seccomp filter refuses the call (DecideReadPath found it before the first read: a filter that
// kills or traps is never called here), each page is checked before a plain copy.
bool ReadOwnMemory(uintptr_t address, void* out, size_t size) {
  const int saved_errno = errno;
  int path = g_read_path.load(std::memory_order_acquire);
  if (path == kUndecided)  // read before PrepareUnwinder (tests): no child, a filter means checks
    path = prctl(PR_GET_SECCOMP, 0, 0, 0, 0) > 0 ? kCheckedCopy : kKernelCopy;
  bool ok = false;
  if (path == kKernelCopy) {
    iovec local{out, size};
    iovec remote{reinterpret_cast<void*>(address), size};
    const ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    const int why = errno;
    if (n == static_cast<ssize_t>(size)) {
      errno = saved_errno;
      return true;
    }
    if (n < 0 && why != EFAULT) {
      // Refused after all (a filter installed since, failing it with an errno): checks from
      // now on.
      if (why == EPERM || why == EACCES || why == ENOSYS) {
        int expected = kKernelCopy;
        g_read_path.compare_exchange_strong(expected, kCheckedCopy, std::memory_order_acq_rel);
      }
      path = kCheckedCopy;
    }
  }
  if (path == kCheckedCopy) ok = CheckedCopy(address, out, size);
  errno = saved_errno;
  return ok;
}

bool OwnMemoryReadsAtomic() {
  const int path = g_read_path.load(std::memory_order_acquire);
  if (path != kUndecided) return path == kKernelCopy;
  const int saved_errno = errno;
  const bool unfiltered = prctl(PR_GET_SECCOMP, 0, 0, 0, 0) <= 0;
  errno = saved_errno;
  return unfiltered;
}

void DecideReadPathForTesting() { DecideReadPath(); }

int FindFrame(const uintptr_t* ips, int count, uintptr_t ip, int window) {
  for (int i = 0; i < count && i < window; ++i) {
    if (ips[i] == ip) return i;
  }
  return -1;
}

}  // namespace detail

std::string MemoryReadProblem() {
  PrepareUnwinder();
  const int path = detail::g_read_path.load(std::memory_order_acquire);
  if (path == detail::kCheckedCopy)
    return std::string("process_vm_readv is refused here (a seccomp filter: ") + detail::g_refusal +
           "): memory for stacks is read after a readability check of each page, and a running thread's Python "
           "frames are not read from another thread (native threads' call sites lack their driving thread's "
           "line; dumps have other threads' Python frames only where the GIL could be had)";
  if (path == detail::kNoRead)
    return std::string("process_vm_readv is refused here (a seccomp filter: ") + detail::g_refusal +
           ") and no readability check works: thread stacks in dumps keep their first frame only and other "
           "threads' Python frames are left out";
  return {};
}

std::string NativeStackProblem() {
  PrepareUnwinder();
  if (detail::g_native_unwind_works) return {};
  return "libunwind.so.8 is not usable in this process (Debian/Ubuntu package libunwind8): call sites and "
         "thread stacks have Python frames only";
}

}  // namespace stacks
}  // namespace ncclwatch
