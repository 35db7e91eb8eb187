#include "common/real_nccl.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include "common/log.h"

namespace ncclwatch {
namespace {

// True for an address inside libncclwatch itself. (Comparing with &::ncclX would not do: in a
// process where NCCL was loaded first, that address is NCCL's, by symbol interposition.)
bool InThisLibrary(void* p) {
  Dl_info mine, theirs;
  return dladdr(reinterpret_cast<void*>(&InThisLibrary), &mine) && dladdr(p, &theirs) &&
         mine.dli_fbase == theirs.dli_fbase;
}

void* Resolve(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f && !InThisLibrary(f)) return f;
  const char* lib = getenv("NCCLWATCH_NCCL_LIB");
  void* h = dlopen(lib && *lib ? lib : "libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return nullptr;
  f = dlsym(h, name);
  return f && !InThisLibrary(f) ? f : nullptr;
}

RealNccl ResolveAll() {
  RealNccl r;
#define NCCLWATCH_RESOLVE(name)                                                                 \
  r.name = reinterpret_cast<decltype(r.name)>(Resolve(#name));
#define NCCLWATCH_RESOLVE_OP(name, kind, params, args, c, d, rd, p) NCCLWATCH_RESOLVE(name)
#define NCCLWATCH_RESOLVE_FN(ret, name, params, args, ...) NCCLWATCH_RESOLVE(name)
  NCCLWATCH_FOR_EACH_OPERATION(NCCLWATCH_RESOLVE_OP)
  NCCLWATCH_FOR_EACH_MANAGED(NCCLWATCH_RESOLVE_FN)
  NCCLWATCH_FOR_EACH_PASSTHROUGH(NCCLWATCH_RESOLVE_FN)
#undef NCCLWATCH_RESOLVE_OP
#undef NCCLWATCH_RESOLVE_FN
#undef NCCLWATCH_RESOLVE
  return r;
}

}  // namespace

const RealNccl& Real() {
  static const RealNccl real = ResolveAll();
  return real;
}

ncclResult_t MissingFunction(const char* name) {
  static std::mutex mu;
  static std::set<std::string> reported;
  std::lock_guard<std::mutex> lock(mu);
  if (reported.insert(name).second)
    LogWarn("the loaded NCCL has no %s (it needs a newer NCCL, or NCCL is not loaded); returning ncclInvalidUsage",
            name);
  return ncclInvalidUsage;
}

}  // namespace ncclwatch
