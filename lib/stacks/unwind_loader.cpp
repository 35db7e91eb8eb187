// libunwind, loaded at run time: linked into libncclwatch.so instead of libunwind.so.8 when the
// library is built self-contained (NCCLWATCH_STATIC_RUNTIME, see lib/CMakeLists.txt).
//
// Why: the preload library lands in every process of a job, so each of its load-time
// dependencies must exist, in a compatible version, in every environment the job runs in.
// Debian's libunwind.a is not position-independent (it cannot go into a shared library), so
// libunwind cannot be linked in; it is opened here with dlopen instead, when ncclwatch starts.
//
// How: this file defines the libunwind functions the stacks code calls (the names libunwind.h
// maps them to) as single indirect jumps through a table. The table starts on stubs that report
// failure and is filled from libunwind.so.8 by ncclwatch_load_libunwind when ncclwatch starts
// (stacks::PrepareUnwinder, which then warms the unwinder up). A jump, not a
// call: unw_getcontext and unw_backtrace see their caller's frame exactly as when linked
// directly, so frame counts and skips are unchanged. Without libunwind.so.8 every entry stays on
// its stub: call sites and thread stacks have no native frames; everything else works.
#define UNW_LOCAL_ONLY
#include <dlfcn.h>
#include <libunwind.h>

#define NCCLWATCH_UNW_STR2(x) #x
#define NCCLWATCH_UNW_STR(x) NCCLWATCH_UNW_STR2(x)

namespace {

int NoContext(unw_context_t*) { return -1; }
int NoInit(unw_cursor_t*, unw_context_t*) { return -UNW_EUNSPEC; }
int NoInit2(unw_cursor_t*, unw_context_t*, int) { return -UNW_EUNSPEC; }
int NoStep(unw_cursor_t*) { return -UNW_EUNSPEC; }
int NoReg(unw_cursor_t*, unw_regnum_t, unw_word_t*) { return -UNW_EUNSPEC; }
int NoSaveLoc(unw_cursor_t*, int, unw_save_loc_t*) { return -UNW_EUNSPEC; }
int NoSignalFrame(unw_cursor_t*) { return 0; }
unw_accessors_t* NoAccessors(unw_addr_space_t) { return nullptr; }
int NoBacktrace(void**, int) { return 0; }

}  // namespace

// X(index in the table, the symbol libunwind.h maps the call to, stub). unw_getcontext is a
// function only on x86_64 (inline assembly on aarch64).
#if defined(__x86_64__)
#define NCCLWATCH_UNW_GETCONTEXT(X) X(8, unw_tdep_getcontext, NoContext)
#else
#define NCCLWATCH_UNW_GETCONTEXT(X)
#endif
#define NCCLWATCH_UNW_FUNCTIONS(X)                \
  X(0, unw_init_local, NoInit)                    \
  X(1, unw_init_local2, NoInit2)                  \
  X(2, unw_step, NoStep)                          \
  X(3, unw_get_reg, NoReg)                        \
  X(4, unw_get_save_loc, NoSaveLoc)               \
  X(5, unw_is_signal_frame, NoSignalFrame)        \
  X(6, unw_get_accessors, NoAccessors)            \
  X(7, unw_backtrace, NoBacktrace)                \
  NCCLWATCH_UNW_GETCONTEXT(X)

constexpr int kEntries = 9;

// In index order. C linkage: the jumps below name it. Hidden, like everything the version
// script does not export.
#define NCCLWATCH_UNW_STUB(index, name, stub) reinterpret_cast<void*>(&stub),
extern "C" {
__attribute__((visibility("hidden"), used)) void* ncclwatch_unw_table[kEntries] = {
    NCCLWATCH_UNW_FUNCTIONS(NCCLWATCH_UNW_STUB)};
}
#undef NCCLWATCH_UNW_STUB

// libunwind's local address space is a variable; copied from the library once it is loaded.
extern "C" __attribute__((visibility("hidden"))) unw_addr_space_t unw_local_addr_space = nullptr;

// One jump per function: `name` is defined (hidden) right here, in assembly.
#if defined(__x86_64__)
#if defined(__CET__) && (__CET__ & 1)
#define NCCLWATCH_UNW_LANDING "endbr64\n"
#else
#define NCCLWATCH_UNW_LANDING ""
#endif
#define NCCLWATCH_UNW_JUMP(index) "jmp *ncclwatch_unw_table+8*" #index "(%rip)\n"
#define NCCLWATCH_UNW_TYPE "@function"
#elif defined(__aarch64__)
#if defined(__ARM_FEATURE_BTI_DEFAULT)
#define NCCLWATCH_UNW_LANDING "bti c\n"
#else
#define NCCLWATCH_UNW_LANDING ""
#endif
#define NCCLWATCH_UNW_JUMP(index)                              \
  "adrp x16, ncclwatch_unw_table\n"                            \
  "add x16, x16, :lo12:ncclwatch_unw_table\n"                  \
  "ldr x16, [x16, 8*" #index "]\n"                             \
  "br x16\n"
#define NCCLWATCH_UNW_TYPE "%function"
#else
#error "libunwind loaded at run time: x86_64 and aarch64 only; configure with -DNCCLWATCH_STATIC_RUNTIME=OFF"
#endif

#define NCCLWATCH_UNW_DEFINE(index, name, stub)                                         \
  asm(".pushsection .text\n"                                                            \
      ".p2align 4\n"                                                                    \
      ".globl " NCCLWATCH_UNW_STR(name) "\n"                                            \
      ".hidden " NCCLWATCH_UNW_STR(name) "\n"                                           \
      ".type " NCCLWATCH_UNW_STR(name) ", " NCCLWATCH_UNW_TYPE "\n"                     \
      NCCLWATCH_UNW_STR(name) ":\n"                                                      \
      NCCLWATCH_UNW_LANDING NCCLWATCH_UNW_JUMP(index)                                   \
      ".size " NCCLWATCH_UNW_STR(name) ", .-" NCCLWATCH_UNW_STR(name) "\n"              \
      ".popsection\n");
NCCLWATCH_UNW_FUNCTIONS(NCCLWATCH_UNW_DEFINE)
#undef NCCLWATCH_UNW_DEFINE

// All or nothing: a libunwind lacking one function is not used at all. Called once, by
// stacks::PrepareUnwinder when ncclwatch starts (never while the library loads: a process that
// does not use NCCL maps no libunwind), before anything unwinds.
extern "C" __attribute__((visibility("hidden"))) void ncclwatch_load_libunwind() {
  void* lib = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return;
  void* found[kEntries] = {};
  bool complete = true;
#define NCCLWATCH_UNW_FIND(index, name, stub)           \
  found[index] = dlsym(lib, NCCLWATCH_UNW_STR(name)); \
  complete = complete && found[index] != nullptr;
  NCCLWATCH_UNW_FUNCTIONS(NCCLWATCH_UNW_FIND)
#undef NCCLWATCH_UNW_FIND
  auto* space = static_cast<unw_addr_space_t*>(dlsym(lib, NCCLWATCH_UNW_STR(unw_local_addr_space)));
  if (!complete || space == nullptr) {
    dlclose(lib);
    return;
  }
  unw_local_addr_space = *space;
  // Before ncclwatch's first unwind, under PrepareUnwinder's lock (nothing of ours jumps
  // through the table before): plain stores.
  for (int i = 0; i < kEntries; ++i)
    if (found[i] != nullptr) ncclwatch_unw_table[i] = found[i];
}
