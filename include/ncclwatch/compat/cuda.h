/* Drop-in for <cuda.h> when the CUDA toolkit is absent: the project's own ABI declarations. */
#ifndef NCCLWATCH_COMPAT_CUDA_H
#define NCCLWATCH_COMPAT_CUDA_H
#include "../cuda_abi.h"
#endif
