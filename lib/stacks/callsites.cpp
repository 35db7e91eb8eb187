// Call sites: capture and intern on the hot path, resolve at dump time.
#include <time.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "common/timing.h"
#include "call_paths.h"
#include "callsite_table.h"
#include "native_unwind.h"
#include "python_api.h"
#include "stacks.h"

namespace ncclwatch {
namespace stacks {
namespace {

constexpr int kMaxSkip = 32;
// unw_backtrace reports the frame of the function calling it (ours) above our caller.
constexpr int kOwnFrames = 1;

#if defined(__SANITIZE_THREAD__)
// libunwind frees unw_backtrace's per-thread trace cache in a thread-exit destructor that locks
// a mutex after ThreadSanitizer has torn the thread down, which crashes TSan. TSan builds walk
// with unw_step instead: the same frames, slower, and the table code under test is the same.
constexpr bool kUseTraceCache = false;
#else
constexpr bool kUseTraceCache = true;
#endif

// Remembered call paths (call_paths.h) need the x86_64 return-address convention.
#if defined(__x86_64__)
constexpr bool kUseCallPaths = true;
__attribute__((always_inline)) inline uintptr_t StackPointer() {
  uintptr_t sp;
  asm volatile("mov %%rsp, %0" : "=r"(sp));
  return sp;
}
#else
constexpr bool kUseCallPaths = false;
inline uintptr_t StackPointer() { return 0; }
#endif

// Zero-initialized static storage, constant-initialized table: no constructor has to run, so
// CaptureCallsite works from any other library's constructor, and pages become resident only
// as entries are used.
static_assert(std::is_trivially_default_constructible<detail::CallsiteEntry>::value,
              "entries must live in zero-initialized storage");
detail::CallsiteEntry g_entries[kCallsiteCapacity];
std::atomic<uint64_t> g_cells[2 * kCallsiteCapacity];
detail::CallsiteTable g_table(g_entries, g_cells, kCallsiteCapacity);
// Call sites with a driving thread's Python frames: that thread runs on, and its lines could
// fill the table if it runs Python while a native thread issues calls; past this many, native
// threads' call sites are interned without them.
constexpr int kMaxDrivenCallsites = kCallsiteCapacity / 16;
std::atomic<int> g_driven_callsites{0};

// Frames read from the driving thread, reused for timing::kDriverFramesReuse (it says why).
struct DriverFrames {
  bool read = false;
  int64_t read_ns = 0;
  uint16_t depth = 0;
  uintptr_t code[kMaxPythonFrames];
  int32_t position[kMaxPythonFrames];
};
thread_local DriverFrames t_driver;

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);  // vDSO, no system call
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// The driving thread's Python frames for a calling thread that has none (see above).
uint16_t DriverPythonFrames(uintptr_t* code, int32_t* position) {
  DriverFrames& d = t_driver;
  const int64_t now = MonotonicNs();
  if (!d.read || now - d.read_ns >= static_cast<int64_t>(timing::Ns(timing::kDriverFramesReuse))) {
    d.depth = static_cast<uint16_t>(detail::CaptureDriverPythonFrames(d.code, d.position, kMaxPythonFrames));
    d.read_ns = now;
    d.read = true;
  }
  std::copy(d.code, d.code + d.depth, code);
  std::copy(d.position, d.position + d.depth, position);
  return d.depth;
}

// The Python frames of call sites, keyed by (code object, position), named under the GIL in
// batches: one GIL acquisition names every frame of every call site published so far.
class PythonFrameCache {
 public:
  using Location = std::pair<uintptr_t, int32_t>;  // code object, position

  bool Has(const Location& location) const { return frames_.count(location) != 0; }

  // Names that came in after their request timed out (see NameAll): into the cache.
  void TakeLateNames() {
    std::lock_guard<std::mutex> lock(late_->mu);
    for (auto& named : late_->frames) frames_[named.first] = std::move(named.second);
    late_->frames.clear();
  }

  // Names every frame of the published call sites that is not named yet. Returns an empty
  // string on success, else why frames stay unnamed.
  std::string NameAll(int gil_timeout_ms) {
    TakeLateNames();
    std::vector<Location> missing;
    std::set<Location> seen;
    detail::CallsiteKey key;
    for (uint32_t id = 0; id < g_table.Size(); ++id) {
      if (!g_table.Get(static_cast<int32_t>(id), &key)) continue;
      for (int i = 0; i < key.python_depth; ++i) {
        const Location location(key.py_code[i], key.py_position[i]);
        if (!Has(location) && seen.insert(location).second) missing.push_back(location);
      }
    }
    if (missing.empty()) return std::string();

    // A request that times out still names them once the GIL is free, while their code lives
    // (at the end, after the interpreter is gone, nothing can be named), a few at a time: its
    // names come back through `late_`, which it shares.
    const bool finish_late = late_->pending.load(std::memory_order_relaxed) < kMaxLateRequests;
    auto state = std::make_shared<std::atomic<int>>(kWaited);
    std::shared_ptr<LateNames> late = late_;
    const detail::GilResult status = detail::RunWithGil(
        [late, missing, state](const detail::PythonApi& api) {
          std::vector<std::pair<Location, PythonFrame>> named;
          const std::string stdlib_dir = detail::StandardLibraryDir(api);
          std::unordered_map<uintptr_t, std::optional<detail::CodeNames>> names;  // nullopt: not live
          for (const Location& location : missing) {
            auto* code = reinterpret_cast<detail::PyObject*>(location.first);
            auto found = names.find(location.first);
            if (found == names.end()) {
              // Captured without the GIL, a code object was only borrowed (stacks.h): name it
              // only if it is still a live one, and keep it so from now on.
              std::optional<detail::CodeNames> code_names;
              if (detail::IsLiveCodeObject(api.code_type, location.first)) {
                api.Py_IncRef(code);
                code_names = detail::NamesOfCode(api, code);
              }
              found = names.emplace(location.first, std::move(code_names)).first;
            }
            PythonFrame frame;  // unnamed: empty file and function, line 0
            if (found->second) {
              frame.file = found->second->file;
              frame.function = found->second->function;
              frame.line = api.LineOf(code, location.second);
              frame.library = detail::IsLibraryFile(frame.file, stdlib_dir);
            }
            named.emplace_back(location, std::move(frame));
          }
          std::lock_guard<std::mutex> lock(late->mu);
          for (auto& n : named) late->frames.push_back(std::move(n));
          if (state->exchange(kRan) == kLeftLate) late->pending.fetch_sub(1, std::memory_order_relaxed);
        },
        gil_timeout_ms, finish_late);
    if (status == detail::GilResult::kTimedOut && finish_late && state->exchange(kLeftLate) == kWaited)
      late_->pending.fetch_add(1, std::memory_order_relaxed);
    TakeLateNames();
    if (status != detail::GilResult::kRan) {
      return std::string("python frames not named: ") + detail::GilResultText(status);
    }
    return std::string();
  }

  // The named frame; an unnamed one has an empty file and function and line 0.
  PythonFrame Frame(const Location& location) const {
    const auto found = frames_.find(location);
    return found != frames_.end() ? found->second : PythonFrame();
  }

 private:
  struct LateNames {
    std::mutex mu;  // never held while waiting for anything
    std::vector<std::pair<Location, PythonFrame>> frames;
    std::atomic<int> pending{0};  // requests queued that may still run
  };
  static constexpr int kMaxLateRequests = 4;  // queued after their caller left, at most
  enum : int { kWaited, kLeftLate, kRan };  // a request: its caller waits, left it to finish late, it ran

  std::map<Location, PythonFrame> frames_;
  std::shared_ptr<LateNames> late_ = std::make_shared<LateNames>();
};

std::atomic<NewCallsiteHook> g_new_callsite_hook{nullptr};
std::atomic<NewPythonCallsiteHook> g_new_python_callsite_hook{nullptr};

}  // namespace

void SetNewPythonCallsiteHook(NewPythonCallsiteHook hook) {
  g_new_python_callsite_hook.store(hook, std::memory_order_release);
}

void SetNewCallsiteHook(NewCallsiteHook hook) {
  g_new_callsite_hook.store(hook, std::memory_order_release);
  if (!hook) return;
  detail::CallsiteKey key;
  // A site interned while this runs may be passed twice: the hook writes the same thing again.
  for (uint32_t id = 0; id < g_table.Size(); ++id)
    if (g_table.Get(static_cast<int32_t>(id), &key)) hook(static_cast<int32_t>(id), key.ips, key.native_depth, key.python_depth);
}

__attribute__((noinline)) int32_t CaptureCallsite(int skip, int max_depth) {
  PrepareUnwinder();  // an atomic load once prepared
  skip = std::min(std::max(skip, 0), kMaxSkip);
  max_depth = std::min(max_depth, kMaxNativeFrames);
  if (max_depth <= 0) return -1;
  const int wanted = kOwnFrames + skip + max_depth;
  void* raw[kOwnFrames + kMaxSkip + kMaxNativeFrames];
  int count;
  const uintptr_t sp = kUseCallPaths ? StackPointer() : 0;
  detail::CallPathCache* paths = kUseCallPaths && wanted <= detail::kMaxPathFrames + 1 ? &detail::ThreadCallPaths() : nullptr;
  const detail::CallPath* known = paths ? detail::FindCallPath(*paths, sp, skip, max_depth) : nullptr;
  detail::CallsiteKey key;
  bool gil_held = false;
  key.python_depth =
      static_cast<uint16_t>(detail::CapturePythonFrames(key.py_code, key.py_position, kMaxPythonFrames, &gil_held));
  key.python_driven = 0;
  if (key.python_depth == 0 && g_driven_callsites.load(std::memory_order_relaxed) < kMaxDrivenCallsites) {
    // A thread running no Python: the line of the thread driving it.
    key.python_depth = DriverPythonFrames(key.py_code, key.py_position);
    key.python_driven = key.python_depth > 0 ? 1 : 0;
  }
  // The same native path as before and no Python: its id is known, nothing to copy or hash.
  if (known && known->native_id >= 0 && key.python_depth == 0) {
    ++paths->hits;
    return known->native_id;
  }
  if (known) {  // the same path as before: no unwind
    ++paths->hits;
    raw[0] = nullptr;  // CaptureCallsite's own frame
    for (int i = 1; i <= known->frames; ++i) raw[i] = reinterpret_cast<void*>(known->ip[i]);
    count = known->frames + 1;
  } else if (kUseTraceCache) {
    count = unw_backtrace(raw, wanted);
  } else {
    unw_context_t context;
    unw_getcontext(&context);
    uintptr_t ips[kOwnFrames + kMaxSkip + kMaxNativeFrames];
    count = detail::UnwindContext(&context, /*signal_frame=*/false, ips, wanted);
    for (int i = 0; i < count; ++i) raw[i] = reinterpret_cast<void*>(ips[i]);
  }
  // Our caller is the frame holding our return address, normally right after our own; look
  // for it so that different inlining inside libunwind cannot shift every call site.
  const void* caller = __builtin_return_address(0);
  int first = kOwnFrames;
  for (int i = 0; i < count && i <= kOwnFrames + 1; ++i) {
    if (raw[i] == caller) {
      first = i;
      break;
    }
  }
  first += skip;
  const int depth = std::min(count - first, max_depth);
  if (depth <= 0) return -1;

  key.native_depth = static_cast<uint16_t>(depth);
  for (int i = 0; i < depth; ++i) key.ips[i] = reinterpret_cast<uintptr_t>(raw[first + i]);
  if (key.python_depth > 0) {
    const int native = detail::FramesBeforeInterpreter(key.ips, key.native_depth);
    if (native > 0) key.native_depth = static_cast<uint16_t>(native);
  }
  const detail::CallsiteTable::InternResult result = g_table.Intern(key);
  if (result.inserted && key.python_driven) g_driven_callsites.fetch_add(1, std::memory_order_relaxed);
  // Under the GIL the code objects can be kept alive right away; otherwise at dump time (stacks.h).
  if (result.inserted && key.python_depth > 0 && gil_held && !key.python_driven) detail::RetainCodeObjects(key.py_code, key.python_depth);
  if (result.inserted)
    if (NewCallsiteHook hook = g_new_callsite_hook.load(std::memory_order_acquire))
      hook(result.id, key.ips, key.native_depth, key.python_depth);
  if (result.inserted && key.python_depth > 0)
    if (NewPythonCallsiteHook hook = g_new_python_callsite_hook.load(std::memory_order_acquire)) hook(result.id);
  if (paths && !known && detail::ShouldLearn(*paths)) {
    unw_context_t context;  // taken here: frame 0 of the path is this function
    unw_getcontext(&context);
    detail::LearnCallPath(*paths, &context, sp, skip, max_depth, raw, count, wanted,
                          key.python_depth == 0 ? result.id : -1);
  }
  return result.id;
}

bool GetCallsite(int32_t id, Callsite* out, int gil_timeout_ms) {
  detail::CallsiteKey key;
  if (!g_table.Get(id, &key)) return false;
  out->ips = WithoutOwnFrames(std::vector<uintptr_t>(key.ips, key.ips + key.native_depth));
  out->python.clear();
  out->note.clear();
  out->driven_from.clear();
  if (key.python_depth == 0) return true;
  if (key.python_driven) out->driven_from = kDrivenFromMainThread;

  // Leaked on purpose: dumps can run while the process exits, after static destructors.
  static std::mutex* mu = new std::mutex;
  static PythonFrameCache* cache = new PythonFrameCache;
  std::lock_guard<std::mutex> lock(*mu);
  std::vector<PythonFrameCache::Location> locations;
  for (int i = 0; i < key.python_depth; ++i) locations.emplace_back(key.py_code[i], key.py_position[i]);
  const bool all_named = std::all_of(locations.begin(), locations.end(),
                                     [](const PythonFrameCache::Location& location) { return cache->Has(location); });
  if (!all_named) out->note = cache->NameAll(gil_timeout_ms);
  for (const auto& location : locations) out->python.push_back(cache->Frame(location));
  const bool some_unnamed = std::any_of(out->python.begin(), out->python.end(),
                                        [](const PythonFrame& f) { return f.file.empty() && f.function.empty(); });
  if (some_unnamed && out->note.empty()) out->note = "python frames not named: their code no longer exists";
  return true;
}

size_t CallsiteCount() { return g_table.Size(); }

size_t CallsiteTableBytes() { return detail::CallsiteTable::BytesFor(kCallsiteCapacity); }

}  // namespace stacks
}  // namespace ncclwatch
