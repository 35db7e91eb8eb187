// Per-thread memo of recent call paths (internal to lib/stacks), so that a training loop that
// reaches NCCL through the same path again and again pays for a full unwind only once.
//
// Why it is exact: an unwinder computes each frame from the one below it: the return address
// it reads from a slot of the stack, the slot's address from the frame's unwind rule, which
// depends only on that return address and the stack pointer. When the path was learnt we
// noted, for every frame, where its return address was read from. A later call with the same
// stack pointer in CaptureCallsite, whose slots all still hold the same return addresses,
// therefore unwinds to the same frames, one by one, and the unwind can be skipped. (Frames
// whose size varies between calls, alloca, are the one exception: they would shift every frame
// below them and with them the stack pointer, which then no longer matches.) A path is only
// memorized when every return address came from a stack slot (no signal frame), and the slots
// read are all between the current stack pointer and the thread's stack top, in memory of this
// thread's own stack: reading them is safe.
//
// Bounded: kPathEntries paths per thread, kMaxPathFrames frames each, in static TLS (no
// allocation). Learning a path costs a slow unwind; it happens while free entries remain and
// then at most once per kRelearnInterval misses, so a thread with many different paths pays
// at most that slow unwind's cost spread over as many captures.
#pragma once

#include <cstdint>

namespace ncclwatch {
namespace stacks {
namespace detail {

constexpr int kPathEntries = 8;
constexpr int kMaxPathFrames = 24;  // own frames + skip + depth: covers the default 16 frames
constexpr uint32_t kRelearnInterval = 64;

struct CallPath {
  uintptr_t sp;      // stack pointer in CaptureCallsite when learnt; 0: free entry
  int16_t skip;      // the request it answers
  int16_t max_depth;
  int16_t frames;    // frames 1 .. frames are the path (frame 0 is CaptureCallsite)
  int16_t checked;   // slots to check: `frames`, or one more when a zero return address ended it
  int32_t native_id;  // interned id of the path as a native-only call site, or -1
  uintptr_t slot[kMaxPathFrames + 2];  // slot[i]: where frame i's return address is stored
  uintptr_t ip[kMaxPathFrames + 2];    // ip[i]: that return address (ip[0] unused)
};

struct CallPathCache {
  CallPath paths[kPathEntries];
  uint32_t next_victim;
  uint32_t misses_since_learn;
  uint64_t hits;  // captures served from a remembered path (read by tests)
};

// The calling thread's cache: zero-initialized TLS, no constructor.
CallPathCache& ThreadCallPaths();

// The path matching this request, or null. Reads only the remembered stack slots.
const CallPath* FindCallPath(CallPathCache& cache, uintptr_t sp, int skip, int max_depth);

// Whether this miss should learn its path (see the header comment on the cost).
bool ShouldLearn(CallPathCache& cache);

// Learns the path of the calling CaptureCallsite: unwinds with unw_step from `context`, noting
// where each return address was read, and stores it if its frames 1..n equal `ips[1..n]` (what
// the fast unwinder found) and every one came from a stack slot. `count`: frames in `ips`,
// `wanted`: how many were asked for.
// `unw_context`: an unw_context_t taken in CaptureCallsite itself (frame 0).
void LearnCallPath(CallPathCache& cache, void* unw_context, uintptr_t sp, int skip, int max_depth,
                   void* const* ips, int count, int wanted, int32_t native_id);

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
