#include "python_frames.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

namespace ncclwatch {
namespace stacks {
namespace detail {
namespace {

// Offsets computed with offsetof() against each version's own headers (Py_BUILD_CORE:
// Include/cpython/pystate.h, Include/cpython/frameobject.h for 3.9/3.10,
// Include/internal/pycore_frame.h, Include/cpython/code.h) of CPython 3.9.18, 3.10.13, 3.11.7,
// 3.12.1 and 3.13.0 on x86_64; they agree with pystack's per-version copies of those structs
// (src/pystack/_pystack/cpython/{thread,frame,code}.h), and on 3.13 they are checked at run time
// against the interpreter's own _Py_DebugOffsets (python_api.cpp). None of these structs
// changed within a minor version.
constexpr FrameLayout kLayouts[] = {
    // 3.9: PyThreadState.frame; PyFrameObject f_back, f_code, f_lasti (bytes).
    {9, 24, -1, true, 24, 32, 104, 1, -1, -1, -1},
    // 3.10: as 3.9, f_lasti moved and counts 2-byte code units.
    {10, 24, -1, true, 24, 32, 96, 2, -1, -1, -1},
    // 3.11: PyThreadState.cframe -> _PyCFrame.current_frame; _PyInterpreterFrame previous,
    // f_code, prev_instr, owner; PyCodeObject.co_code_adaptive.
    {11, 56, 8, false, 48, 32, 56, 0, 69, -1, 184},
    // 3.12: the frame's fields reordered; C-stack shim frames (owner FRAME_OWNED_BY_CSTACK = 3).
    {12, 56, 0, false, 8, 0, 56, 0, 70, 3, 192},
    // 3.13: PyThreadState.current_frame; f_executable, instr_ptr (the current instruction).
    {13, 72, -1, false, 8, 0, 56, 0, 70, 3, 200},
};

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
bool SafeRead(uintptr_t address, void* out, size_t size) {
  iovec local{out, size};
  iovec remote{reinterpret_cast<void*>(address), size};
  const ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  if (n == static_cast<ssize_t>(size)) return true;
  if (n >= 0 || errno == EFAULT) return false;
  // process_vm_readv refused (a seccomp filter): a pipe's write says EFAULT just the same.
  static std::mutex* mu = new std::mutex;
  static int fds[2] = {-1, -1};
  std::lock_guard<std::mutex> lock(*mu);
  if (fds[0] < 0 && pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  if (write(fds[1], reinterpret_cast<const void*>(address), size) != static_cast<ssize_t>(size)) return false;
  return read(fds[0], out, size) == static_cast<ssize_t>(size);
}

}  // namespace

const FrameLayout* FrameLayoutFor(int major, int minor) {
  if (major != 3) return nullptr;
  for (const FrameLayout& layout : kLayouts) {
    if (layout.minor == minor) return &layout;
  }
  return nullptr;
}

int WalkPythonFrames(const FrameWalker& walker, uintptr_t tstate, uintptr_t* code, int32_t* offset, int max) {
  const FrameLayout* layout = walker.layout;
  if (layout == nullptr || !Plausible(tstate)) return 0;
  uintptr_t frame = Load<uintptr_t>(tstate + layout->tstate_frame);
  if (layout->cframe_current_frame >= 0) {
    if (!Plausible(frame)) return 0;
    frame = Load<uintptr_t>(frame + layout->cframe_current_frame);
  }
  int count = 0;
  for (int step = 0; count < max && step < kMaxWalkSteps && Plausible(frame);
       ++step, frame = Load<uintptr_t>(frame + layout->frame_back)) {
    if (layout->frame_is_object && Load<uintptr_t>(frame + kObType) != walker.frame_type) break;
    // The interpreter's entry shims run no Python code of the user's (PyEval_GetFrame skips them).
    if (layout->owner_cstack >= 0 && Load<char>(frame + layout->frame_owner) == layout->owner_cstack) continue;
    const uintptr_t co = Load<uintptr_t>(frame + layout->frame_code);
    if (!Plausible(co) || Load<uintptr_t>(co + kObType) != walker.code_type) break;
    int64_t bytes;
    if (layout->lasti_unit > 0) {
      bytes = int64_t{Load<int>(frame + layout->frame_instr)} * layout->lasti_unit;  // -1: not started
    } else {
      bytes = static_cast<int64_t>(Load<uintptr_t>(frame + layout->frame_instr) - (co + layout->code_adaptive));
      // A frame still in its prologue points before its first instruction: CPython skips
      // such "incomplete" frames too.
      if (bytes < 0 || bytes >= 2 * Load<int64_t>(co + kObSize)) continue;
    }
    code[count] = co;
    offset[count] = static_cast<int32_t>(bytes);
    ++count;
  }
  return count;
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
