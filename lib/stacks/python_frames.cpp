#include "python_frames.h"

#include "native_unwind.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ncclwatch {
namespace stacks {
namespace detail {
namespace {

// Where the walked fields are, one row per CPython minor version. Each row is the output of
// scripts/gen-python-layout.sh: offsetof() and sizeof() against that version's own headers
// (Py_BUILD_CORE), here those of 3.9.18, 3.10.13, 3.11.7, 3.12.1 and 3.13.0 on x86_64. A new
// version is a regeneration (README.md, "Development"); the stacks_python_layout tests
// regenerate the row of each python3 whose headers are here and compare. The rows agree with
// pystack's per-version copies of these structs (src/pystack/_pystack/cpython/{thread,frame,
// code}.h), and on 3.13 they are checked at run time against the interpreter's own
// _Py_DebugOffsets (python_api.cpp). None of these structs changed within a minor version.
// Designated initializers are C++20 syntax that g++ and clang accept in C++17 (a warning under
// -pedantic only): the compiler checks each name and their order.
// clang-format off
constexpr FrameLayout kLayouts[] = {
    // 3.9: PyThreadState.frame; PyFrameObject f_back, f_code, f_lasti (bytes).
    {.minor = 9, .tstate_frame = 24, .cframe_current_frame = -1,
     .frame_is_object = true, .frame_back = 24, .frame_code = 32, .frame_instr = 104, .lasti_unit = 1,
     .frame_owner = -1, .owner_cstack = -1, .code_adaptive = -1,
     .tstate_thread_id = 176, .code_filename = 104, .code_name = 112, .ascii_data = 48},
    // 3.10: as 3.9, f_lasti moved and counts 2-byte code units.
    {.minor = 10, .tstate_frame = 24, .cframe_current_frame = -1,
     .frame_is_object = true, .frame_back = 24, .frame_code = 32, .frame_instr = 96, .lasti_unit = 2,
     .frame_owner = -1, .owner_cstack = -1, .code_adaptive = -1,
     .tstate_thread_id = 176, .code_filename = 104, .code_name = 112, .ascii_data = 48},
    // 3.11: PyThreadState.cframe -> _PyCFrame.current_frame; _PyInterpreterFrame previous,
    // f_code, prev_instr, owner; PyCodeObject.co_code_adaptive.
    {.minor = 11, .tstate_frame = 56, .cframe_current_frame = 8,
     .frame_is_object = false, .frame_back = 48, .frame_code = 32, .frame_instr = 56, .lasti_unit = 0,
     .frame_owner = 69, .owner_cstack = -1, .code_adaptive = 184,
     .tstate_thread_id = 152, .code_filename = 112, .code_name = 120, .ascii_data = 48},
    // 3.12: the frame's fields reordered; C-stack shim frames (owner FRAME_OWNED_BY_CSTACK = 3).
    {.minor = 12, .tstate_frame = 56, .cframe_current_frame = 0,
     .frame_is_object = false, .frame_back = 8, .frame_code = 0, .frame_instr = 56, .lasti_unit = 0,
     .frame_owner = 70, .owner_cstack = 3, .code_adaptive = 192,
     .tstate_thread_id = 136, .code_filename = 112, .code_name = 120, .ascii_data = 40},
    // 3.13: PyThreadState.current_frame; f_executable, instr_ptr (the current instruction).
    {.minor = 13, .tstate_frame = 72, .cframe_current_frame = -1,
     .frame_is_object = false, .frame_back = 8, .frame_code = 0, .frame_instr = 56, .lasti_unit = 0,
     .frame_owner = 70, .owner_cstack = 3, .code_adaptive = 200,
     .tstate_thread_id = 152, .code_filename = 112, .code_name = 120, .ascii_data = 40},
};
// clang-format on

// A walk longer than this is a corrupt chain (skipped shim frames included).
constexpr int kMaxWalkSteps = 256;

// Non-null, aligned, below the top of the user address space (57-bit at most).
inline bool Plausible(uintptr_t p) { return p >= 4096 && (p & 7) == 0 && p < (uintptr_t{1} << 56); }

template <typename T>
inline T Load(uintptr_t address) {
  T value;
  std::memcpy(&value, reinterpret_cast<const void*>(address), sizeof(T));
  return value;
}

constexpr int kObType = 8;   // PyObject.ob_type (all versions, without Py_TRACE_REFS)
constexpr int kObSize = 16;  // PyVarObject.ob_size: a code object's length in 2-byte units (3.11+)

// Reads `size` bytes at `address` of this process without faulting: false where unmapped.
bool SafeRead(uintptr_t address, void* out, size_t size) { return ReadOwnMemory(address, out, size); }

}  // namespace

const FrameLayout* FrameLayoutFor(int major, int minor) {
  if (major != 3) return nullptr;
  for (const FrameLayout& layout : kLayouts) {
    if (layout.minor == minor) return &layout;
  }
  return nullptr;
}

namespace {

// Reads of the calling thread's own, unchanging chain: plain loads.
struct DirectReader {
  template <typename T>
  bool operator()(uintptr_t address, T* out) const {
    *out = Load<T>(address);
    return true;
  }
};
// Reads of a running thread's chain: false where the memory is gone.
struct GuardedReader {
  template <typename T>
  bool operator()(uintptr_t address, T* out) const {
    return SafeRead(address, out, sizeof(T));
  }
};

template <typename Reader>
int Walk(const FrameWalker& walker, const Reader& read, uintptr_t tstate, uintptr_t* code, int32_t* offset, int max) {
  const FrameLayout* layout = walker.layout;
  if (layout == nullptr || !Plausible(tstate)) return 0;
  uintptr_t frame = 0;
  if (!read(tstate + layout->tstate_frame, &frame)) return 0;
  if (layout->cframe_current_frame >= 0) {
    if (!Plausible(frame) || !read(frame + layout->cframe_current_frame, &frame)) return 0;
  }
  int count = 0;
  for (int step = 0; count < max && step < kMaxWalkSteps && Plausible(frame); ++step) {
    const uintptr_t here = frame;
    if (!read(here + layout->frame_back, &frame)) break;
    uintptr_t type = 0;
    if (layout->frame_is_object && (!read(here + kObType, &type) || type != walker.frame_type)) break;
    // The interpreter's entry shims run no Python code of the user's (PyEval_GetFrame skips them).
    char owner = 0;
    if (layout->owner_cstack >= 0) {
      if (!read(here + layout->frame_owner, &owner)) break;
      if (owner == layout->owner_cstack) continue;
    }
    uintptr_t co = 0;
    if (!read(here + layout->frame_code, &co) || !Plausible(co) || !read(co + kObType, &type) ||
        type != walker.code_type) {
      break;
    }
    int64_t bytes;
    if (layout->lasti_unit > 0) {
      int lasti = 0;
      if (!read(here + layout->frame_instr, &lasti)) break;
      bytes = int64_t{lasti} * layout->lasti_unit;  // -1: not started
    } else {
      uintptr_t instr = 0;
      int64_t units = 0;
      if (!read(here + layout->frame_instr, &instr) || !read(co + kObSize, &units)) break;
      bytes = static_cast<int64_t>(instr - (co + layout->code_adaptive));
      // A frame still in its prologue points before its first instruction: CPython skips
      // such "incomplete" frames too.
      if (bytes < 0 || bytes >= 2 * units) continue;
    }
    code[count] = co;
    offset[count] = static_cast<int32_t>(bytes);
    ++count;
  }
  return count;
}

// A compact ASCII str object's characters (at most 4096); false otherwise.
bool AsciiString(const FrameWalker& walker, uintptr_t object, std::string* out) {
  struct {
    uint64_t refcnt, type;
    int64_t length;
    int64_t hash;
    uint32_t state;
  } header;
  if (!Plausible(object) || !SafeRead(object, &header, sizeof header)) return false;
  const bool compact = (header.state >> 5) & 1, ascii = (header.state >> 6) & 1;  // same bits 3.9 to 3.13
  if (header.type != walker.unicode_type || !compact || !ascii || header.length < 0 || header.length > 4096) {
    return false;
  }
  out->resize(static_cast<size_t>(header.length));
  return header.length == 0 || SafeRead(object + walker.layout->ascii_data, &(*out)[0], out->size());
}

}  // namespace

int WalkPythonFrames(const FrameWalker& walker, uintptr_t tstate, uintptr_t* code, int32_t* offset, int max) {
  return Walk(walker, DirectReader{}, tstate, code, offset, max);
}

int WalkOtherThreadFrames(const FrameWalker& walker, uintptr_t tstate, uintptr_t* code, int32_t* offset, int max) {
  // Its frames' memory may be unmapped as it runs: read only where a read cannot fault.
  if (!OwnMemoryReadsAtomic()) return 0;
  return Walk(walker, GuardedReader{}, tstate, code, offset, max);
}

int OtherThreadStates(const FrameWalker& walker, uintptr_t head, uintptr_t* tstates, uint64_t* thread_ids, int max) {
  constexpr int kTstateNext = 8;  // PyThreadState.next, 3.9 to 3.13 (as OldestThreadState)
  if (walker.layout == nullptr) return 0;
  int count = 0;
  for (uintptr_t tstate = head; count < max && Plausible(tstate);) {
    uint64_t id = 0;
    uintptr_t next = 0;
    if (!SafeRead(tstate + walker.layout->tstate_thread_id, &id, sizeof id) ||
        !SafeRead(tstate + kTstateNext, &next, sizeof next)) {
      break;
    }
    tstates[count] = tstate;
    thread_ids[count] = id;
    ++count;
    if (next == head) break;  // a corrupt, circular list
    tstate = next;
  }
  return count;
}

uintptr_t OldestThreadState(uintptr_t head) {
  constexpr int kTstateNext = 8;        // PyThreadState.next, 3.9 to 3.13
  constexpr int kMaxThreadStates = 256;  // bounded: a longer list is a corrupt one
  uintptr_t last = 0;
  for (int i = 0; i < kMaxThreadStates && Plausible(head); ++i) {
    last = head;
    if (!SafeRead(head + kTstateNext, &head, sizeof head)) return 0;
  }
  return Plausible(head) ? 0 : last;  // a list that did not end is no answer
}

bool CodeNamesWithoutGil(const FrameWalker& walker, uintptr_t code, std::string* file, std::string* function) {
  if (walker.layout == nullptr || walker.unicode_type == 0) return false;
  uintptr_t file_object = 0, name_object = 0;
  return SafeRead(code + walker.layout->code_filename, &file_object, sizeof file_object) &&
         SafeRead(code + walker.layout->code_name, &name_object, sizeof name_object) &&
         AsciiString(walker, file_object, file) && AsciiString(walker, name_object, function);
}

bool IsLiveCodeObject(uintptr_t code_type, uintptr_t address) {
  if (!Plausible(address) || code_type == 0) return false;
  uint64_t header[2];  // ob_refcnt, ob_type
  if (!SafeRead(address, header, sizeof header)) return false;
  // Live counts are small (immortal ones, 3.12+, are 2^32 - 1); pymalloc's free-list pointer
  // or glibc's mangled one is far larger, or 0.
  return header[1] == code_type && header[0] > 0 && header[0] < (uint64_t{1} << 36);
}

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
