#include "gpu/driver.h"

#include <dlfcn.h>

namespace ncclwatch {

bool CudaDriver::Load(const std::string& library, std::string* why) {
  // Prefer the driver the application already loaded; load it ourselves only if needed.
  void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (!h) h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    *why = "cannot load " + library + ": " + (e ? e : "unknown error");
    return false;
  }
  CudaDriver d;
#define NCCLWATCH_DRIVER_LOAD(field, params, sym1, sym2)                               \
  {                                                                                     \
    void* f = dlsym(h, sym1);                                                           \
    if (!f) f = dlsym(h, sym2);                                                         \
    if (!f) {                                                                           \
      *why = std::string(library) + " has no " + sym1;                                  \
      return false;                                                                     \
    }                                                                                   \
    d.field = reinterpret_cast<decltype(d.field)>(f);                                   \
  }
  NCCLWATCH_FOR_EACH_DRIVER_FN(NCCLWATCH_DRIVER_LOAD)
#undef NCCLWATCH_DRIVER_LOAD
#define NCCLWATCH_DRIVER_LOAD_OPTIONAL(field, params, sym1, sym2)                      \
  {                                                                                     \
    void* f = dlsym(h, sym1);                                                           \
    if (!f) f = dlsym(h, sym2);                                                         \
    d.field = reinterpret_cast<decltype(d.field)>(f);                                   \
  }
  NCCLWATCH_FOR_EACH_OPTIONAL_DRIVER_FN(NCCLWATCH_DRIVER_LOAD_OPTIONAL)
#undef NCCLWATCH_DRIVER_LOAD_OPTIONAL
  // cuInit is idempotent; the application has called it already if it uses NCCL.
  if (d.Init(0) != CUDA_SUCCESS) {
    *why = "cuInit failed";
    return false;
  }
  d.DriverGetVersion(&d.version);
  *this = d;
  return true;
}

}  // namespace ncclwatch
