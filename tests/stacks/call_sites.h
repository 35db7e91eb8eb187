// Call sites with known names for the stack tests. They are exported (default visibility, and
// the test programs link with -rdynamic) so that dladdr can name them, and never inlined.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#define STACKS_TEST_SITE __attribute__((visibility("default"), noinline))
// After a call: keeps it from being a tail call, so the calling function keeps its frame.
#define STACKS_KEEP_FRAME() asm volatile("" ::: "memory")

namespace stacks_test {

STACKS_TEST_SITE int32_t CaptureAtSiteA(int max_depth);
STACKS_TEST_SITE int32_t CaptureAtSiteB(int max_depth);
// Captures with skip = 1: frame 0 is the caller of this function.
STACKS_TEST_SITE int32_t CaptureSkippingSelf();

// Two functions with the same code (so the same frame size), each reaching CaptureAtSiteA(16)
// through the same Middle function: the two paths differ only in one return address, at the
// same stack address, which is what a remembered call path must notice.
STACKS_TEST_SITE int32_t ViaOuterA();
STACKS_TEST_SITE int32_t ViaOuterB();

// A distinct call stack for every `path` (its low `levels` bits choose between two functions at
// each level), for filling the table with many call sites.
STACKS_TEST_SITE int32_t CaptureOnPath(unsigned path, int levels);

// The demangled symbols of `ips`, innermost first.
std::vector<std::string> SymbolsOf(const std::vector<uintptr_t>& ips);
// Whether some symbol of `ips` contains `function`.
bool StackContains(const std::vector<uintptr_t>& ips, const std::string& function);

}  // namespace stacks_test
