#include "call_paths.h"

#include <type_traits>

#include "native_unwind.h"
#include "testing.h"

namespace ncclwatch {
namespace stacks {
namespace detail {

static_assert(std::is_trivially_default_constructible<CallPathCache>::value, "lives in zero-initialized TLS");

CallPathCache& ThreadCallPaths() {
  static thread_local CallPathCache cache;
  return cache;
}

uint64_t CallPathHitsForTesting() { return ThreadCallPaths().hits; }

// Reads the remembered slots of the stack. When the path differs, a slot may now hold any
// data (a local of another function, or an ASan redzone): compared, never used.
__attribute__((no_sanitize_address)) static bool SlotsHold(const CallPath& p) {
  for (int i = 1; i <= p.checked; ++i) {
    if (*reinterpret_cast<const volatile uintptr_t*>(p.slot[i]) != p.ip[i]) return false;
  }
  return true;
}

const CallPath* FindCallPath(CallPathCache& cache, uintptr_t sp, int skip, int max_depth) {
  for (const CallPath& p : cache.paths) {
    if (p.sp != sp || p.skip != skip || p.max_depth != max_depth) continue;
    if (SlotsHold(p)) return &p;
  }
  return nullptr;
}

bool ShouldLearn(CallPathCache& cache) {
  if (cache.paths[cache.next_victim % kPathEntries].sp == 0) return true;  // a free entry
  if (++cache.misses_since_learn < kRelearnInterval) return false;
  cache.misses_since_learn = 0;
  return true;
}

void LearnCallPath(CallPathCache& cache, void* unw_context, uintptr_t sp, int skip, int max_depth,
                   void* const* ips, int count, int wanted, int32_t native_id) {
  if (wanted > kMaxPathFrames + 1 || count > wanted) return;
  CallPath p{};
  unw_cursor_t cursor;
  if (unw_init_local(&cursor, static_cast<unw_context_t*>(unw_context)) < 0) return;
  int frames = 0;
  bool zero_end = false;
  while (frames + 1 < wanted) {
    const int step = unw_step(&cursor);
    if (step < 0) return;
    if (step == 0) break;  // the outermost frame's unwind rule ends the stack: fixed by its address
    if (unw_is_signal_frame(&cursor) > 0) return;
    unw_word_t ip = 0;
    unw_save_loc_t where;
    if (unw_get_reg(&cursor, UNW_REG_IP, &ip) < 0) return;
    if (unw_get_save_loc(&cursor, UNW_REG_IP, &where) < 0 || where.type != UNW_SLT_MEMORY) return;
    const uintptr_t slot = static_cast<uintptr_t>(where.u.addr);
    // Only slots of this thread's stack above us, holding what was read from them.
    if (slot < sp || *reinterpret_cast<const uintptr_t*>(slot) != ip) return;
    p.slot[frames + 1] = slot;
    p.ip[frames + 1] = static_cast<uintptr_t>(ip);
    if (ip == 0) {  // a zero return address ends the stack too: its slot is remembered
      zero_end = true;
      break;
    }
    ++frames;
  }
  // The fast unwinder must agree, frame for frame (its frame 0 is elsewhere in CaptureCallsite).
  if (frames != count - 1) return;
  for (int i = 1; i <= frames; ++i)
    if (p.ip[i] != reinterpret_cast<uintptr_t>(ips[i])) return;
  p.sp = sp;
  p.skip = static_cast<int16_t>(skip);
  p.max_depth = static_cast<int16_t>(max_depth);
  p.frames = static_cast<int16_t>(frames);
  p.checked = static_cast<int16_t>(zero_end ? frames + 1 : frames);
  p.native_id = native_id;
  cache.paths[cache.next_victim++ % kPathEntries] = p;
}

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
