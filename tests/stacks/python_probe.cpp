// Loaded by test_python_stacks.py through ctypes: drives lib/stacks inside a real CPython
// process and answers in JSON. Calls made through ctypes.PyDLL keep the GIL, those made through
// ctypes.CDLL release it, which is how the script chooses.
#include <time.h>

#include <chrono>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "stacks.h"

using namespace ncclwatch::stacks;
using nlohmann::json;

namespace {

json PythonJson(const std::vector<PythonFrame>& frames) {
  json out = json::array();
  for (const PythonFrame& f : frames) {
    out.push_back({{"file", f.file}, {"line", f.line}, {"function", f.function}, {"library", f.library}});
  }
  return out;
}

json SymbolsJson(const std::vector<uintptr_t>& ips) {
  json out = json::array();
  for (uintptr_t ip : ips) out.push_back(Symbolize(ip).symbol);
  return out;
}

// Copies `value` into out[size] (NUL-terminated); returns the size needed, like snprintf.
int Answer(const json& value, char* out, int size) {
  const std::string text = value.dump();
  if (static_cast<int>(text.size()) < size) std::memcpy(out, text.c_str(), text.size() + 1);
  return static_cast<int>(text.size()) + 1;
}

json CallsiteJson(int id, int gil_timeout_ms) {
  Callsite callsite;
  if (!GetCallsite(id, &callsite, gil_timeout_ms)) return nullptr;
  return {{"symbols", SymbolsJson(callsite.ips)}, {"python", PythonJson(callsite.python)}, {"note", callsite.note}, {"driven_from", callsite.driven_from}};
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int nw_install(int signo) { return InstallThreadStackSignal(signo); }

__attribute__((visibility("default"), noinline)) int nw_capture_callsite(int skip, int depth) {
  const int id = CaptureCallsite(skip, depth);
  asm volatile("" ::: "memory");
  return id;
}

__attribute__((visibility("default"))) int nw_callsite_json(int id, int gil_timeout_ms, char* out, int size) {
  return Answer(CallsiteJson(id, gil_timeout_ms), out, size);
}

// All threads, after sleeping delay_ms (so that a caller releasing the GIL can let another
// thread take it), then call site `callsite_id` (when >= 0) resolved right after, in the same
// call: a Python caller could not come back in between while another thread holds the GIL.
__attribute__((visibility("default"))) int nw_threads_json(int per_thread_ms, int gil_timeout_ms, int delay_ms,
                                                           int callsite_id, char* out, int size) {
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  const auto start = std::chrono::steady_clock::now();
  std::string note;
  const std::vector<ThreadStack> threads = CaptureAllThreads(per_thread_ms, true, gil_timeout_ms, &note);
  const double elapsed_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  json list = json::array();
  for (const ThreadStack& t : threads) {
    list.push_back({{"tid", t.tid}, {"name", t.name}, {"note", t.note}, {"symbols", SymbolsJson(t.ips)},
                    {"python", PythonJson(t.python)}});
  }
  json answer = {{"elapsed_ms", elapsed_ms}, {"note", note}, {"threads", list}};
  if (callsite_id >= 0) answer["callsite"] = CallsiteJson(callsite_id, gil_timeout_ms);
  return Answer(answer, out, size);
}

// A call site captured on a thread of its own that never ran Python code.
__attribute__((visibility("default"))) int nw_capture_on_native_thread(int depth) {
  int id = -1;
  std::thread([&id, depth] { id = nw_capture_callsite(0, depth); }).join();
  return id;
}

__attribute__((visibility("default"))) void nw_set_python_callsites(int enabled) { SetPythonCallsites(enabled != 0); }

__attribute__((visibility("default"))) int nw_python_callsite_problem(char* out, int size) {
  return Answer(PythonCallsiteProblem(), out, size);
}

// Spins without ever releasing the GIL when called through ctypes.PyDLL.
// Nearly all its time in its own loop, which touches no memory (nothing for a sanitizer to
// instrument): the stack signal lands here, not in a callee (clock reads, TSan's hooks) that
// libunwind may fail to unwind from.
__attribute__((visibility("default"), noinline)) void nw_spin_holding_gil(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    for (long i = 0; i < 10000000; ++i) asm volatile("" : "+r"(i));
  } while (std::chrono::steady_clock::now() < end);
}

// Mean cost of CaptureCallsite (from one call site, Python frames included when the GIL is
// held), in ns of this thread's CPU time per call: a busy machine's preemptions do not count.
__attribute__((visibility("default"))) double nw_capture_cost_ns(int iterations, int depth) {
  const auto cpu_ns = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
  };
  const double start = cpu_ns();
  for (int i = 0; i < iterations; ++i) nw_capture_callsite(0, depth);
  return (cpu_ns() - start) / iterations;
}

// The same, from a native thread of its own (no Python frames: its call sites carry the
// calling Python thread's, the driving one's) while the caller waits for it.
__attribute__((visibility("default"))) double nw_native_thread_capture_cost_ns(int iterations, int depth) {
  double cost = 0;
  std::thread([&] { cost = nw_capture_cost_ns(iterations, depth); }).join();
  return cost;
}

}  // extern "C"
