#include "native_unwind.h"

#include <string>

#include "stacks.h"

namespace ncclwatch {
namespace stacks {
namespace detail {
namespace {

bool g_native_unwind_works = false;  // written once while the library loads

// libunwind initializes itself on first use without full synchronization (ThreadSanitizer
// reports it when threads start unwinding together), and that first use should not be in a
// signal handler: do it once while the library loads, before the application's threads run.
__attribute__((constructor)) void WarmUpUnwinder() {
  unw_context_t context;
  uintptr_t ips[2];
  // Where libunwind was not found (the self-contained build opens it at run time) both calls
  // fail: that is what NativeStackProblem reports.
  g_native_unwind_works = unw_getcontext(&context) == 0 && UnwindContext(&context, /*signal_frame=*/false, ips, 2) > 0;
}

}  // namespace

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

int FindFrame(const uintptr_t* ips, int count, uintptr_t ip, int window) {
  for (int i = 0; i < count && i < window; ++i) {
    if (ips[i] == ip) return i;
  }
  return -1;
}

}  // namespace detail

std::string NativeStackProblem() {
  if (detail::g_native_unwind_works) return {};
  return "libunwind.so.8 is not usable in this process (Debian/Ubuntu package libunwind8): call sites and "
         "thread stacks have Python frames only";
}

}  // namespace stacks
}  // namespace ncclwatch
