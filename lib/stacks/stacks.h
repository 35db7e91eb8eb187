// Stack capture for ncclwatch: call-site interning on the hot path (CaptureCallsite), and at
// dump time symbolization and every thread's stacks, native and Python.
// A call site is the calling thread's raw return addresses (libunwind's unw_backtrace; a path
// taken again is not unwound again: call_paths.h) and, in a process running CPython 3.9+, its
// innermost Python frames as (code object, instruction offset), read whether the thread holds
// the GIL or not (python_api.h, python_frames.h). Nothing is named on the hot path. The native
// frames stop where the interpreter's own code begins, so that one Python line keeps one id
// while CPython specializes its bytecode. Interned call sites live in a fixed, lock-free table
// (kCallsiteCapacity): when it is full, a new call site gets -1 (known ones still work).
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

// Opens libunwind (the self-contained build) and initializes it, closing the memory-check pipe
// it opens and reading memory through a check that needs no file descriptor. Called when
// ncclwatch starts; idempotent, thread-safe, and called by the functions below that unwind.
void PrepareUnwinder();

// ---- hot path (called on every intercepted NCCL operation) ----
// Captures the calling thread's native stack (dropping `skip` frames above the caller, at most
// `max_depth` <= kMaxNativeFrames frames) and, when the thread holds the GIL, its innermost
// Python frames; interns them and returns the call site's id (>= 0), or -1 when the capture
// failed or the table is full. No locks, no heap allocation, no I/O. Thread-safe.
// (The first call in a process looks up the CPython symbols once; the first call in a thread
// lets libunwind map its per-thread trace cache.)
int32_t CaptureCallsite(int skip, int max_depth);

// Called once per new call site, on the thread that interned it (the hot path, once per
// distinct call site): its raw return addresses (own frames included, innermost first) and how
// many Python frames it has. For copying them where a dead process's host can read them (the
// black box): no locks, allocation or I/O. Null: none.
using NewCallsiteHook = void (*)(int32_t id, const uintptr_t* ips, int native_depth, int python_depth);
// Sets the hook and calls it for every call site interned so far (not the hot path).
void SetNewCallsiteHook(NewCallsiteHook hook);

// Called once per new call site that has Python frames, on the thread that interned it, right
// after the NewCallsiteHook: where a process killed moments later must keep its Python line,
// the frames can be named now (GetCallsite with a short GIL wait: the thread holds the GIL, or
// released it for its NCCL call). Once per distinct call site, never in steady state. Null: none.
using NewPythonCallsiteHook = void (*)(int32_t id);
void SetNewPythonCallsiteHook(NewPythonCallsiteHook hook);

// Python frames in call sites on (the default) or off (NCCLWATCH_PYTHON=0), for the process.
void SetPythonCallsites(bool enabled);
// Why call sites get Python frames only where the caller holds the GIL (this CPython's frame
// layout is not known), for one log line; empty when they get them always, or when the process
// runs no CPython. Looks the interpreter up (a few dlsym) on first use.
std::string PythonCallsiteProblem();
// How this process reads its own memory when process_vm_readv is refused (a seccomp filter,
// found before the first read), for one log line; empty when the call works.
std::string MemoryReadProblem();
// Why call sites and thread stacks get no native frames (libunwind.so.8 could not be loaded, or
// it cannot walk this process's stack), for one log line; empty when native stacks work.
std::string NativeStackProblem();

// ---- ncclwatch's own code and threads ----
// Frames in the object file that holds `address` are ncclwatch's own (libncclwatch.so passes
// one of its functions at start). GetCallsite drops them from the top of the call sites it
// returns, and WithoutOwnFrames from a thread's stack, so that a stack starts with the
// application's code, not with ncclwatch's dump code.
void SetOwnModule(const void* address);
bool IsOwnFrame(uintptr_t ip);  // ip: a return address
// `ips` without its own frames at the top (innermost first); unchanged when every frame is own.
std::vector<uintptr_t> WithoutOwnFrames(const std::vector<uintptr_t>& ips);
// Marks the calling thread as ncclwatch's own (the watchdog, the GIL helper), until it calls
// UnmarkOwnThread: CaptureAllThreads sets ThreadStack::own for it.
void MarkOwnThread();
void UnmarkOwnThread();
bool IsOwnThread(int tid);

// ---- the loaded modules, for symbolizing after the process is gone (not the hot path) ----
struct LoadedModule {
  uintptr_t bias = 0, lo = 0, hi = 0;  // load bias; the range its PT_LOAD segments cover
  bool own = false;                    // ncclwatch itself (SetOwnModule)
  std::string build_id, path;          // path: the main program's own, not ""
};
std::vector<LoadedModule> LoadedModules();
// Changes whenever a module is loaded or unloaded (cheap: one step of dl_iterate_phdr).
uint64_t ModulesGeneration();

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
  // Set when the calling thread ran no Python code (a C++ thread: autograd's, a library's) and
  // `python` is the stack of the Python thread driving it, read without the GIL when the call
  // was captured: which thread that was (kDrivenFromMainThread).
  std::string driven_from;
};
// Callsite::driven_from: the interpreter's first thread (the main thread), which drives the
// native threads (it waits in backward() while autograd's threads issue the collectives).
constexpr const char* kDrivenFromMainThread = "main thread";

// Resolves call site `id`, without ncclwatch's own frames at the top (SetOwnModule). The names
// of its Python frames are read under the GIL, taken on a helper thread with a bounded wait
// (gil_timeout_ms); the results are cached, so a dump that walks all call sites takes the GIL
// about once, and when the GIL is stuck the dump waits about one gil_timeout_ms in all.
// Unnamed frames keep an empty file and function (and line 0), with `note` saying why (the GIL
// was not had in time, or the code object no longer exists). Returns false for an unknown id.
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
// A name is given only when ip - 1 lies inside the symbol (its st_size, or for a symbol without
// a size the unwind table's function that starts there): a stripped library's nearest exported
// symbol can be far away, and then the frame is module+offset, never a wrong name. Every
// frame that has a module also has its build id (NT_GNU_BUILD_ID, hex) and module_offset
// (ip - the module's load bias: the address `addr2line -e MODULE` takes), for later
// symbolization.
// `interrupted`: ip is the instruction a signal interrupted (the frame above it is a signal
// trampoline, or it is a signalled thread's first frame), looked up as it is.
NativeFrame Symbolize(uintptr_t ip, bool interrupted = false);

struct ThreadStack {
  int tid = 0;  // -1 for a Python thread that could not be matched to a native thread
  std::string name;              // /proc/self/task/<tid>/comm
  bool own = false;              // one of ncclwatch's own threads (MarkOwnThread)
  // pthread_self() of the thread (what Python's threading.get_ident() returns), 0 when unknown:
  // matches Python threads to native ones where Thread.native_id cannot (a forked child keeps
  // its parent's native_id).
  uint64_t pthread_id = 0;
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
// In a signal handler, from its ucontext: whether that signal cut the thread's system call short
// (the call returns EINTR once the handler is done). Async-signal-safe; false where the
// registers cannot tell (only x86-64 is read).
bool SignalCutSystemCall(const void* ucontext);

// Stacks of every thread of the process (from /proc/self/task). A thread blocked in a system
// call is unwound where the kernel says it waits, without a signal; one seen running is looked
// at again for up to timing::kRunningPatience (unwound so if it waits at one of the looks) and
// once more right before its signal. A running thread unwinds its own
// native stack in the signal handler, into a preallocated slot; threads are signalled in
// parallel batches of up to 64 and each batch waits at most per_thread_timeout_ms. A thread
// that blocks the signal or is stopped is not signalled; one that does not answer in time gets
// an empty stack and a note. The calling thread captures itself directly (frame 0 = its caller).
// With `python`, when the process embeds CPython, the Python stack of every Python thread is
// added (matched by its ident to the pthread_self() each thread reports, else by
// Thread.native_id), read under the GIL with a bounded wait (gil_timeout_ms);
// if the GIL cannot be had in time, native stacks only are returned and a note says so, on the
// main thread's entry and in *note. Calls are serialized: a call that cannot start within
// per_thread_timeout_ms returns no threads (*note says why). Never blocks longer than the
// timeouts (worst case: one per_thread_timeout_ms per batch, plus gil_timeout_ms).
// `sampled`, when given, lists the threads whose native stacks are wanted (the others are not
// signalled: a signal cuts their sleep, poll or epoll_wait short with EINTR); they are listed
// with their Python stacks only and a note.
std::vector<ThreadStack> CaptureAllThreads(int per_thread_timeout_ms, bool python, int gil_timeout_ms,
                                           std::string* note = nullptr, const std::vector<int>* sampled = nullptr);
// The note of a thread CaptureAllThreads did not sample.
constexpr const char* kNotSampledNote =
    "native stack not sampled: only the main thread and the threads that call NCCL are signalled";

// ---- the uncaught exception a Python job ends with ----
// Adds, once per process, a C audit hook of ours to CPython (PySys_AddAuditHook, under the GIL,
// taken with a bounded wait): nothing Python code can see or count (no atexit callback, no
// sys.excepthook of its own). It keeps the exception that the interpreter reports as uncaught
// (the "sys.excepthook" event of PyErr_Print, on the main thread at top level) for
// LastUncaughtException, described once, without running the exception's own __str__ again;
// an exception a program handled and left in sys.last_value, sys.exit() and os._exit() leave
// none. True when done (or there is nothing to do: no CPython); false when the GIL was not had
// in time (call again).
bool WatchPythonExit(int gil_timeout_ms);
// The exception the interpreter last reported as uncaught; false when there was none.
bool LastUncaughtException(trace::UncaughtException* out);

}  // namespace stacks
}  // namespace ncclwatch
