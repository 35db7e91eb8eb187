// Our own declarations (no nccl.h) agree with the layout facts the real header is checked
// against, and every listed function maps to a known op kind.
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "ncclwatch/nccl_abi.h"
#include "ncclwatch/trace_format.h"

static_assert(sizeof(ncclUniqueId) == NCCLWATCH_ABI_UNIQUE_ID_SIZE, "ncclUniqueId size");
static_assert(offsetof(ncclConfig_t, commName) == NCCLWATCH_ABI_CONFIG_COMMNAME_OFFSET, "commName offset");
static_assert(sizeof(ncclConfig_t) == NCCLWATCH_ABI_CONFIG_SIZE_2_28, "ncclConfig_t size");
static_assert(sizeof(ncclRedOp_t) == 4 && sizeof(ncclDataType_t) == 4, "enum sizes");

int main() {
  int failures = 0, count = 0;
  // Every data-moving function names an op kind of the trace format, by the same spelling.
#define NCCLWATCH_CHECK_KIND(name, kind, params, args, c, d, r, p)                                   \
  ++count;                                                                                            \
  if (std::strcmp(ncclwatch::trace::OpKindName(ncclwatch::trace::OpKind::kind), #kind) != 0) {        \
    std::printf("%s: op kind %s has no name\n", #name, #kind);                                        \
    ++failures;                                                                                       \
  }
  NCCLWATCH_FOR_EACH_OPERATION(NCCLWATCH_CHECK_KIND)
  if (count != 11) {
    std::printf("expected 11 data-moving functions, found %d\n", count);
    ++failures;
  }
  std::printf("%d passed, %d failed\n", count - failures, failures);
  return failures ? 1 : 0;
}
