// Stack capture for ncclwatch: call-site interning on the hot path, symbolization and
// all-thread stacks (native and Python) at dump time.
//
// What a call site captures (CaptureCallsite), and why:
//  - Native: the raw return addresses of the calling thread, innermost first, taken with
//    libunwind's unw_backtrace (its x86_64 fast-trace cache makes repeated call sites cheap).
//    Frame 0 is the caller of CaptureCallsite, after `skip` more frames are dropped. Nothing
//    is symbolized on the hot path: names are looked up at dump time (Symbolize).
//    A path a thread takes again (a training loop) is not unwound again: each thread remembers
//    its recent paths with the stack slots their return addresses were read from, and a call
//    whose slots all still hold them is the same path (call_paths.h says why that is exact).
//  - Python: only when the process embeds CPython 3.9+ (found with dlsym; libpython is never
//    linked) and the calling thread holds the GIL right now. Then the innermost
//    kMaxPythonFrames frames are recorded as (code object, position) pairs, the position being
//    the frame's last instruction offset (3.11+; turned into a line number at dump time,
//    because computing lines scans line tables) or else its line number. They are part of the
//    key, so the same native path reached from different Python lines gives different ids.
//    The native frames then stop where the interpreter's own code begins: the Python frames
//    say what the interpreter was running, and its frames change as CPython specializes
//    bytecode, which would otherwise give one Python line several ids.
//    A newly interned call site takes one reference (Py_IncRef) on its code objects and never
//    drops it, so they are still valid at dump time, when their file and function names are
//    read under the GIL. Python's frame API materializes frame objects for those frames, as
//    sys._getframe() does: CPython's allocation, under the GIL, never ours.
//  - Without the GIL (PyTorch releases it around collectives) no Python object is touched:
//    the call site has native frames only, through the interpreter up to its outermost frames.
//  - The interned call sites live in a fixed, lock-free table (kCallsiteCapacity entries);
//    when it is full, CaptureCallsite returns -1 for new call sites (known ones still work).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format/records.h"

namespace ncclwatch {
namespace stacks {

constexpr int kMaxNativeFrames = 32;       // per call site
constexpr int kMaxPythonFrames = 8;        // per call site, innermost first
constexpr int kCallsiteCapacity = 4096;    // distinct call sites per process
constexpr int kMaxThreadFrames = 128;      // native frames per thread in CaptureAllThreads
constexpr int kMaxThreadPythonFrames = 64;  // Python frames per thread in CaptureAllThreads

// ---- hot path (called on every intercepted NCCL operation) ----
// Captures the calling thread's native stack (dropping `skip` frames above the caller, at most
// `max_depth` <= kMaxNativeFrames frames) and, when the thread holds the GIL, its innermost
// Python frames; interns them and returns the call site's id (>= 0), or -1 when the capture
// failed or the table is full. No locks, no heap allocation, no I/O. Thread-safe.
// (The first call in a process looks up the CPython symbols once; the first call in a thread
// lets libunwind map its per-thread trace cache.)
int32_t CaptureCallsite(int skip, int max_depth);

// ---- dump time: normal thread context only, never a signal handler (they allocate, lock,
// and may run Python code under the GIL) ----
// The trace format's frame types (format/records.h): capture, dump and report share them.
// NativeFrame: ip, module (path of the object file), symbol (demangled; empty when unknown),
// offset (ip - symbol start when `symbol` is set, else ip - module load base, for addr2line).
// PythonFrame: file, line, function, library (site-packages, the standard library, torch...).
using NativeFrame = trace::NativeFrame;
using PythonFrame = trace::PythonFrame;
struct Callsite {
  std::vector<uintptr_t> ips;         // return addresses, innermost first
  std::vector<PythonFrame> python;    // innermost first; empty when captured without the GIL
  std::string note;                   // set when Python frames exist but could not be named (GIL unavailable)
};

// Resolves call site `id`. The names of its Python frames are read under the GIL, taken on a
// helper thread with a bounded wait (gil_timeout_ms); the results are cached, so a dump that
// walks all call sites takes the GIL about once, and when the GIL is stuck the dump waits about
// one gil_timeout_ms in all. Unnamed frames keep an empty file and function (and line 0 on
// Python 3.11+), with `note` saying why. Returns false for an unknown id.
bool GetCallsite(int32_t id, Callsite* out, int gil_timeout_ms = 1000);
// Ids are dense, from 0 in insertion order; CallsiteCount() is one past the last. A few ids
// may never be published (two threads inserting the same new call site at the same moment both
// get the winner's id; the loser's entry stays unused): GetCallsite refuses those.
size_t CallsiteCount();
// Memory reserved for the call-site table (static storage; pages become resident as call
// sites are added: the hash index plus about sizeof(entry) per call site).
size_t CallsiteTableBytes();

// Names `ip` with dladdr and abi::__cxa_demangle; cached. `ip` is a return address: the lookup
// uses ip - 1 so that a call at the very end of a function is attributed to that function.
NativeFrame Symbolize(uintptr_t ip);

struct ThreadStack {
  int tid = 0;  // -1 for a Python thread that could not be matched to a native thread
  std::string name;              // /proc/self/task/<tid>/comm
  // Innermost first. For a signalled thread ips[0] is the exact interrupted pc (Symbolize's
  // ip - 1 still names the right function unless the pc is a function's first byte); all
  // other ips are return addresses.
  std::vector<uintptr_t> ips;
  std::vector<PythonFrame> python;
  std::string note;              // why frames are missing or incomplete
};

// Installs the handler CaptureAllThreads uses to make each thread capture its own stack.
// Only if `signo` currently has SIG_DFL; returns false (changing nothing) otherwise, and when a
// handler is already installed. Call once, at library start. The handler uses SA_RESTART, so
// restartable system calls are restarted; calls that are never restarted (nanosleep,
// epoll_wait, poll, ...) return EINTR in the interrupted thread, as with any signal.
bool InstallThreadStackSignal(int signo);
// The signal InstallThreadStackSignal installed, 0 if none.
int ThreadStackSignal();

// Stacks of every thread of the process (from /proc/self/task). Each thread unwinds its own
// native stack in the signal handler, into a preallocated slot; threads are signalled in
// parallel batches of up to 64 and each batch waits at most per_thread_timeout_ms. A thread
// that blocks the signal or is stopped is not signalled; one that does not answer in time gets
// an empty stack and a note. The calling thread captures itself directly (frame 0 = its caller).
// With `python`, when the process embeds CPython, the Python stack of every Python thread is
// added (matched by Thread.native_id), read under the GIL with a bounded wait (gil_timeout_ms);
// if the GIL cannot be had in time, native stacks only are returned and a note says so, on the
// main thread's entry and in *note. Calls are serialized: a call that cannot start within
// per_thread_timeout_ms returns no threads (*note says why). Never blocks longer than the
// timeouts (worst case: one per_thread_timeout_ms per batch, plus gil_timeout_ms).
std::vector<ThreadStack> CaptureAllThreads(int per_thread_timeout_ms, bool python, int gil_timeout_ms,
                                           std::string* note = nullptr);

}  // namespace stacks
}  // namespace ncclwatch
