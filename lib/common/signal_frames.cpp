#include "common/signal_frames.h"

#include <dlfcn.h>

#include <atomic>

namespace ncclwatch {
namespace {

std::atomic<uintptr_t> g_trampoline{0};

}  // namespace

uintptr_t SignalTrampoline() { return g_trampoline.load(); }

void SetSignalTrampoline(uintptr_t address) { g_trampoline.store(address); }

bool InOurLibrary(uintptr_t ip) {
  Dl_info mine, theirs;
  return dladdr(reinterpret_cast<void*>(&InOurLibrary), &mine) && dladdr(reinterpret_cast<void*>(ip), &theirs) &&
         mine.dli_fbase == theirs.dli_fbase;
}

}  // namespace ncclwatch
