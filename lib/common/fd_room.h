// Descriptors are the application's. RLIMIT_NOFILE bounds them, and an application near its
// limit needs every one it counted on: the library opens a descriptor only while at least
// kFdReserve more stay free under the soft limit, keeps one across the application's code only
// when the limit is generous (kKeepFdsMinLimit), and otherwise goes without (one line says
// what was skipped). Counting needs no descriptor: poll() on the numbers says which are free.
#pragma once

namespace ncclwatch {

// Free descriptors the library always leaves to the application.
constexpr int kFdReserve = 4;
// Below this soft RLIMIT_NOFILE no descriptor is kept open (the black box's, the relay's and
// the caretaker's locks): a job that set its limit this low counted its descriptors.
constexpr int kKeepFdsMinLimit = 64;
// Descriptors a dump holds at once (the thread list, a thread's stat, the mappings, a module
// read for its symbols, the dump file), the exit record's included.
constexpr int kFdsForDump = 4;

// The soft RLIMIT_NOFILE (a large number when unlimited).
int FdLimit();
// True when `need` descriptors can be opened now and kFdReserve still stay free. `*free_out`
// (optional): the free ones counted (at least need + kFdReserve when true). Async-signal-safe.
bool FdRoom(int need, int* free_out = nullptr);

}  // namespace ncclwatch
