// The real NCCL functions behind our wrappers, resolved once: dlsym(RTLD_NEXT) first; when
// NCCL was loaded into a local scope (Python extensions are dlopen'ed RTLD_LOCAL), from the
// already-loaded NCCL_LIB handle. A function the loaded NCCL lacks stays null.
#pragma once

#include "ncclwatch/nccl_abi.h"

namespace ncclwatch {

struct RealNccl {
#define NCCLWATCH_REAL_OP(name, kind, params, args, c, d, r, p) ncclResult_t(*name) params = nullptr;
#define NCCLWATCH_REAL_FN(ret, name, params, args, ...) ret(*name) params = nullptr;
  NCCLWATCH_FOR_EACH_OPERATION(NCCLWATCH_REAL_OP)
  NCCLWATCH_FOR_EACH_MANAGED(NCCLWATCH_REAL_FN)
  NCCLWATCH_FOR_EACH_PASSTHROUGH(NCCLWATCH_REAL_FN)
#undef NCCLWATCH_REAL_OP
#undef NCCLWATCH_REAL_FN
};

const RealNccl& Real();
// One line (once per function) and the value to return for a function NCCL lacks.
ncclResult_t MissingFunction(const char* name);

}  // namespace ncclwatch
