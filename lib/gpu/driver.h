// The CUDA driver API, loaded at run time (never linked) so that ncclwatch works with whatever
// CUDA runtime the application uses and builds without a CUDA toolkit.
#pragma once

#include <string>

#include "ncclwatch/cuda_abi.h"

namespace ncclwatch {

struct CudaDriver {
#define NCCLWATCH_DRIVER_FIELD(field, params, sym1, sym2) CUresult(*field) params = nullptr;
  NCCLWATCH_FOR_EACH_DRIVER_FN(NCCLWATCH_DRIVER_FIELD)
  NCCLWATCH_FOR_EACH_OPTIONAL_DRIVER_FN(NCCLWATCH_DRIVER_FIELD)  // null when absent
#undef NCCLWATCH_DRIVER_FIELD
  int version = 0;

  // Loads `library` (the one already in the process if any). False, with `why` set, when the
  // library or one of the functions is missing: ncclwatch then records without GPU markers.
  bool Load(const std::string& library, std::string* why);
  bool loaded() const { return EventRecord != nullptr; }
};

}  // namespace ncclwatch
