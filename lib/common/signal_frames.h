// What ncclwatch's signal handlers (process/signals.h) leave on a thread's stack, for the dumps
// that cut it off: here, below both, so that dumps never include the signal handling.
#pragma once

#include <cstdint>

namespace ncclwatch {

// The address the kernel returns to after a handler (glibc's restorer), 0 if unknown: a
// thread's stack that has ncclwatch's handler above this frame was interrupted by our signal,
// and the frames below it are the application's. Set when the handlers are installed.
uintptr_t SignalTrampoline();
void SetSignalTrampoline(uintptr_t address);
// True for an address inside libncclwatch itself.
bool InOurLibrary(uintptr_t ip);

}  // namespace ncclwatch
