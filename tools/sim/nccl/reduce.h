// Datatypes and reductions of the simulated NCCL: one codec per storage format and one fold
// template for every (datatype, operation) pair.
#pragma once

#include <cstddef>

namespace simnccl {

// First id of ncclRedOpCreatePreMulSum operations (after the built-in ncclSum..ncclAvg).
constexpr int kFirstUserRedOp = 5;
// Internal code passed to Reduce() for a user (pre-multiplied sum) operation.
constexpr int kRedOpPreMulSum = 1000;

// Bytes per element, 0 for an unknown datatype.
size_t DtypeSize(int dtype);

// dst[i] = op(srcs[0][i], ..., srcs[n-1][i]) for i < count. avg divides the sum by n;
// kRedOpPreMulSum multiplies the sum by `scalar` (equal to summing pre-multiplied inputs in
// exact arithmetic). Integers wrap; 16- and 8-bit floats are computed in float and rounded
// to nearest even on store. dst must not overlap the sources.
void Reduce(int dtype, int op, double scalar, void* dst, const void* const* srcs, int n,
            size_t count);

// The value at p, of NCCL datatype `dtype`, as a double (ncclRedOpCreatePreMulSum scalars).
double LoadAsDouble(int dtype, const void* p);

// Exposed for tests: the float <-> minifloat codec used for float16, bfloat16 and float8.
// `ieee`: the format has infinities (float16, bfloat16, e5m2); otherwise it is the
// "finite" variant (e4m3fn: no infinity, saturates, only all-ones-mantissa max exponent is NaN).
double MiniDecode(unsigned bits, int exp_bits, int man_bits, bool ieee);
unsigned MiniEncode(double v, int exp_bits, int man_bits, bool ieee);

}  // namespace simnccl
