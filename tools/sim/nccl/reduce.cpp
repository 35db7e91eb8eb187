#include "reduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ncclwatch/nccl_abi.h"

namespace simnccl {

double MiniDecode(unsigned bits, int E, int M, bool ieee) {
  const int bias = (1 << (E - 1)) - 1;
  const unsigned emax_field = (1u << E) - 1, man_mask = (1u << M) - 1;
  const bool neg = (bits >> (E + M)) & 1;
  const unsigned e = (bits >> M) & emax_field, m = bits & man_mask;
  double v;
  if (ieee && e == emax_field) {
    v = m ? NAN : INFINITY;
  } else if (!ieee && e == emax_field && m == man_mask) {
    v = NAN;
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - M);  // subnormal
  } else {
    v = std::ldexp(static_cast<double>(m | (1u << M)), static_cast<int>(e) - bias - M);
  }
  return neg ? -v : v;
}

unsigned MiniEncode(double v, int E, int M, bool ieee) {
  const int bias = (1 << (E - 1)) - 1;
  const unsigned emax_field = (1u << E) - 1, man_mask = (1u << M) - 1;
  const unsigned sign = std::signbit(v) ? 1u << (E + M) : 0;
  if (std::isnan(v)) return ieee ? (emax_field << M) | (1u << (M - 1)) : (emax_field << M) | man_mask;
  // Largest finite encoding: ieee formats reserve the top exponent; e4m3fn only its NaN.
  const unsigned max_finite = ieee ? ((emax_field - 1) << M) | man_mask : (emax_field << M) | (man_mask - 1);
  const unsigned overflow = ieee ? emax_field << M : max_finite;  // inf, or saturate
  double a = std::fabs(v);
  if (std::isinf(a)) return sign | overflow;
  int ex = 0;
  std::frexp(a, &ex);                          // a = f * 2^ex, f in [0.5, 1)
  int e_unb = std::max(ex - 1, 1 - bias);      // subnormals share the minimum exponent
  // Significand scaled to an integer with M fraction bits, rounded to nearest even.
  auto q = static_cast<unsigned long long>(std::nearbyint(std::ldexp(a, M - e_unb)));
  if (q >> (M + 1)) {  // rounding carried into the next binade
    q >>= 1;
    ++e_unb;
  }
  unsigned bits;
  if (q >> M) {
    long efield = e_unb + bias;
    if (efield > static_cast<long>(emax_field)) return sign | overflow;
    bits = static_cast<unsigned>(efield << M) | static_cast<unsigned>(q & man_mask);
  } else {
    bits = static_cast<unsigned>(q);  // subnormal (or zero)
  }
  if (bits > max_finite) return sign | overflow;
  return sign | bits;
}

namespace {

// Storage <-> computation. Native types compute in themselves.
template <class T>
struct Native {
  using Store = T;
  using Calc = T;
  static Calc Load(Store v) { return v; }
  static Store Save(Calc v) { return v; }
};

// Minifloats (float16, bfloat16, float8) compute in float.
template <int E, int M, bool Ieee>
struct Mini {
  using Store = std::conditional_t<(1 + E + M <= 8), uint8_t, uint16_t>;
  using Calc = float;
  static Calc Load(Store v) { return static_cast<float>(MiniDecode(v, E, M, Ieee)); }
  static Store Save(Calc v) { return static_cast<Store>(MiniEncode(v, E, M, Ieee)); }
};

// Integer + and * wrap (through the unsigned type: signed overflow is undefined in C++).
template <class T>
T Add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <class T>
T Mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

template <class Tr, class Combine, class Finish>
void Fold(void* dst, const void* const* srcs, int n, size_t count, Combine combine, Finish finish) {
  using S = typename Tr::Store;
  auto* out = static_cast<S*>(dst);
  for (size_t i = 0; i < count; ++i) {
    auto acc = Tr::Load(static_cast<const S*>(srcs[0])[i]);
    for (int r = 1; r < n; ++r) acc = combine(acc, Tr::Load(static_cast<const S*>(srcs[r])[i]));
    out[i] = Tr::Save(finish(acc));
  }
}

template <class Tr>
void ReduceAs(int op, double scalar, void* dst, const void* const* srcs, int n, size_t count) {
  using C = typename Tr::Calc;
  auto same = [](C v) { return v; };
  switch (op) {
    case ncclSum:
      return Fold<Tr>(dst, srcs, n, count, Add<C>, same);
    case ncclProd:
      return Fold<Tr>(dst, srcs, n, count, Mul<C>, same);
    case ncclMax:
      return Fold<Tr>(dst, srcs, n, count, [](C a, C b) { return a < b ? b : a; }, same);
    case ncclMin:
      return Fold<Tr>(dst, srcs, n, count, [](C a, C b) { return b < a ? b : a; }, same);
    case ncclAvg:
      return Fold<Tr>(dst, srcs, n, count, Add<C>, [n](C v) { return static_cast<C>(v / static_cast<C>(n)); });
    case kRedOpPreMulSum:
      return Fold<Tr>(dst, srcs, n, count, Add<C>,
                      [s = static_cast<C>(scalar)](C v) { return Mul<C>(v, s); });
    default:
      return;
  }
}

// The one list of datatypes: NCCL enum value -> storage/computation traits.
#define SIMNCCL_FOR_EACH_DTYPE(X)  \
  X(ncclInt8, (Native<int8_t>))           \
  X(ncclUint8, (Native<uint8_t>))         \
  X(ncclInt32, (Native<int32_t>))         \
  X(ncclUint32, (Native<uint32_t>))       \
  X(ncclInt64, (Native<int64_t>))         \
  X(ncclUint64, (Native<uint64_t>))       \
  X(ncclFloat16, (Mini<5, 10, true>))     \
  X(ncclFloat32, (Native<float>))         \
  X(ncclFloat64, (Native<double>))        \
  X(ncclBfloat16, (Mini<8, 7, true>))     \
  X(ncclFloat8e4m3, (Mini<4, 3, false>))  \
  X(ncclFloat8e5m2, (Mini<5, 2, true>))

// Strips the parentheses that protect template commas inside the list: `void (T)` is a
// function type whose parameter is T.
template <class T>
struct Unwrap;
template <class T>
struct Unwrap<void(T)> {
  using type = T;
};
#define SIMNCCL_TRAITS(tr) Unwrap<void tr>::type

}  // namespace

size_t DtypeSize(int dtype) {
  switch (dtype) {
#define SIMNCCL_SIZE(e, tr) \
  case e:                   \
    return sizeof(SIMNCCL_TRAITS(tr)::Store);
    SIMNCCL_FOR_EACH_DTYPE(SIMNCCL_SIZE)
#undef SIMNCCL_SIZE
    default:
      return 0;
  }
}

double LoadAsDouble(int dtype, const void* p) {
  switch (dtype) {
#define SIMNCCL_LOAD(e, tr)                                                            \
  case e: {                                                                            \
    using Tr = SIMNCCL_TRAITS(tr);                                                     \
    typename Tr::Store v;                                                              \
    memcpy(&v, p, sizeof v);                                                           \
    return static_cast<double>(Tr::Load(v));                                           \
  }
    SIMNCCL_FOR_EACH_DTYPE(SIMNCCL_LOAD)
#undef SIMNCCL_LOAD
    default:
      return 0;
  }
}

void Reduce(int dtype, int op, double scalar, void* dst, const void* const* srcs, int n,
            size_t count) {
  if (n <= 0 || count == 0) return;
  switch (dtype) {
#define SIMNCCL_REDUCE(e, tr)                                          \
  case e:                                                              \
    return ReduceAs<SIMNCCL_TRAITS(tr)>(op, scalar, dst, srcs, n, count);
    SIMNCCL_FOR_EACH_DTYPE(SIMNCCL_REDUCE)
#undef SIMNCCL_REDUCE
    default:
      return;
  }
}

}  // namespace simnccl
