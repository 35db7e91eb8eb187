/* Drop-in for <nccl.h> when the CUDA toolkit is absent: the project's own ABI declarations. */
#ifndef NCCLWATCH_COMPAT_NCCL_H
#define NCCLWATCH_COMPAT_NCCL_H
#include "../nccl_abi.h"
#endif
