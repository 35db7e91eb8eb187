#define UNW_LOCAL_ONLY
#include <cxxabi.h>
#include <dlfcn.h>
#include <libunwind.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "stacks.h"

namespace ncclwatch {
namespace stacks {
namespace {

std::string Demangle(const char* name) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) return name;  // a C symbol, or not a mangled name
  std::string result(demangled);
  std::free(demangled);
  return result;
}

NativeFrame Lookup(uintptr_t ip) {
  NativeFrame frame;
  frame.ip = ip;
  Dl_info info;
  // ip - 1: a return address can be the first byte after the function that made the call.
  if (ip == 0 || dladdr(reinterpret_cast<void*>(ip - 1), &info) == 0) return frame;
  if (info.dli_fname != nullptr) frame.module = info.dli_fname;
  if (info.dli_sname != nullptr && info.dli_saddr != nullptr) {
    frame.symbol = Demangle(info.dli_sname);
    frame.offset = ip - reinterpret_cast<uintptr_t>(info.dli_saddr);
    return frame;
  }
  // dladdr sees exported symbols only; libunwind reads the object's full symbol table
  // (.symtab), which names static and hidden functions too when the file is not stripped.
  char name[512];
  unw_word_t off = 0;
  unw_accessors_t* acc = unw_get_accessors(unw_local_addr_space);
  if (acc && acc->get_proc_name &&
      acc->get_proc_name(unw_local_addr_space, ip - 1, name, sizeof name, &off, nullptr) == 0 && name[0]) {
    frame.symbol = Demangle(name);
    frame.offset = off + 1;
    return frame;
  }
  frame.offset = ip - reinterpret_cast<uintptr_t>(info.dli_fbase);
  return frame;
}

}  // namespace

NativeFrame Symbolize(uintptr_t ip) {
  // Leaked on purpose: dumps can run while the process exits, after static destructors.
  static std::mutex* mu = new std::mutex;
  static auto* cache = new std::unordered_map<uintptr_t, NativeFrame>;
  {
    std::lock_guard<std::mutex> lock(*mu);
    const auto found = cache->find(ip);
    if (found != cache->end()) return found->second;
  }
  NativeFrame frame = Lookup(ip);  // dladdr takes the loader lock: not under ours
  std::lock_guard<std::mutex> lock(*mu);
  return cache->emplace(ip, std::move(frame)).first->second;
}

}  // namespace stacks
}  // namespace ncclwatch
