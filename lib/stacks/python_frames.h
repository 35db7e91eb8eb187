// Python frames read from the interpreter's own structures, without the GIL (internal to
// lib/stacks).
//
// PyTorch's c10d bindings release the GIL around every collective, and a thread that released
// it may not call the C API. Its frame chain is still there, and cannot change while the
// thread is blocked in our wrapper: the thread state (found through PyGILState's TLS key,
// which needs no GIL) points at the innermost frame, each frame at its caller, its code object
// and its current instruction. Those few fields are read at fixed offsets, one small table per
// CPython minor version (FrameLayout), chosen once from the running interpreter's version.
//
// Reads are guarded, never trusted: every pointer must be non-null, aligned and in the user
// address range, a 3.9/3.10 frame object must have PyFrame_Type, every code object
// PyCode_Type (both found with dlsym), an instruction offset must lie inside its code, and the
// walk is bounded. A version without a table (or a build whose layout differs: free-threaded,
// Py_TRACE_REFS) gets no walker, and then only callers holding the GIL get Python frames,
// through the C API as before.
#pragma once

#include <cstdint>
#include <string>

namespace ncclwatch {
namespace stacks {
namespace detail {

// Where the fields the walk reads are, for one CPython minor version (x86_64 and aarch64
// LP64: the layouts have no architecture-dependent padding before these fields).
struct FrameLayout {
  int minor;                 // 3.<minor>
  int tstate_frame;          // PyThreadState: frame (3.9/3.10), cframe (3.11/3.12), current_frame (3.13)
  int cframe_current_frame;  // _PyCFrame.current_frame (3.11/3.12); -1: tstate_frame is the frame
  bool frame_is_object;      // 3.9/3.10: frames are PyFrameObjects (ob_type checked)
  int frame_back;            // f_back / previous
  int frame_code;            // f_code / f_executable
  int frame_instr;           // f_lasti (int, 3.9/3.10) or prev_instr / instr_ptr (pointer, 3.11+)
  int lasti_unit;            // bytes per f_lasti unit (3.9: 1, 3.10: 2); 0 when frame_instr is a pointer
  int frame_owner;           // _PyInterpreterFrame.owner (char), -1: none
  int owner_cstack;          // owner value of C-stack shim frames (3.12+), skipped; -1: none
  int code_adaptive;         // PyCodeObject.co_code_adaptive (3.11+: instructions), -1: none
  // Dump time, for other threads' states (read without the GIL):
  int tstate_thread_id;      // PyThreadState.thread_id (the thread's pthread_self())
  int code_filename;         // PyCodeObject.co_filename
  int code_name;             // PyCodeObject.co_name
  int ascii_data;            // sizeof(PyASCIIObject): where a compact ASCII string's characters start
};

// The table for 3.<minor>, or null when it has none.
const FrameLayout* FrameLayoutFor(int major, int minor);

// Everything the walk needs, resolved once per process.
struct FrameWalker {
  const FrameLayout* layout = nullptr;  // null: no walker
  uintptr_t code_type = 0;              // &PyCode_Type
  uintptr_t frame_type = 0;             // &PyFrame_Type
  uintptr_t unicode_type = 0;           // &PyUnicode_Type (0: code objects are not named without the GIL)
};

// Walks from thread state `tstate` (PyThreadState*, may be null) outwards and stores up to `max`
// frames as (code object, offset in bytes of the frame's current instruction); returns how
// many. Reads only; no allocation, no lock, no call into CPython.
int WalkPythonFrames(const FrameWalker& walker, uintptr_t tstate, uintptr_t* code, int32_t* offset, int max);

// ---- dump time, other threads (the GIL is held by someone else: what out-of-process samplers
// do, in-process). The thread runs while we read, so every read goes through process_vm_readv:
// a frame popped (and its memory unmapped) under us ends the walk, it does not fault. Where a
// seccomp filter refuses that call, ReadOwnMemory checks each page before it copies, and a page
// unmapped between the two would fault: frames are then not walked (OwnMemoryReadsAtomic).

// As WalkPythonFrames, for the thread state of another, running thread.
int WalkOtherThreadFrames(const FrameWalker& walker, uintptr_t tstate, uintptr_t* code, int32_t* offset, int max);

// The interpreter's thread states from `head` (PyInterpreterState_ThreadHead) along ->next,
// with each one's thread_id (its pthread_self()); at most `max`; returns how many.
int OtherThreadStates(const FrameWalker& walker, uintptr_t head, uintptr_t* tstates, uint64_t* thread_ids, int max);

// The last thread state of the list from `head` (the oldest: the interpreter's first thread,
// normally the main thread), read through guarded reads; 0 when none.
uintptr_t OldestThreadState(uintptr_t head);

// File and function name of live code object `code` (IsLiveCodeObject), read without the GIL:
// compact ASCII strings only (the common case; others would need the GIL to convert); false
// when either cannot be read.
bool CodeNamesWithoutGil(const FrameWalker& walker, uintptr_t code, std::string* file, std::string* function);

// Dump time: whether `address` is, right now, a live code object: its header can be read
// (checked with process_vm_readv, so that an unmapped address is an answer, not a fault), its
// type is PyCode_Type and its reference count a plausible one (a freed object's first word
// holds the allocator's free-list pointer).
bool IsLiveCodeObject(uintptr_t code_type, uintptr_t address);

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
