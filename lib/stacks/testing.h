// Hooks for lib/stacks' own tests (internal).
#pragma once

namespace ncclwatch {
namespace stacks {
namespace detail {

// CaptureAllThreads skips threads whose /proc status says they block the stack signal. With
// `check` false it signals them anyway, so that tests can reach the no-answer path (a thread
// that blocks the signal after the check looks the same).
void SetCheckSignalMaskForTesting(bool check);

// Captures on the calling thread served from a remembered call path (call_paths.h), without
// unwinding.
uint64_t CallPathHitsForTesting();

// Decides again how ReadOwnMemory reads (as PrepareUnwinder does once, before the first read):
// for a forked test process that has just installed a seccomp filter.
void DecideReadPathForTesting();

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
