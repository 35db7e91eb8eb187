// libFuzzer entry point for the dump reader (built and run by fuzz.sh, not by ctest).
#include <cstddef>
#include <cstdint>

#include "fuzz_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ncclwatch::testing::ExerciseDumpBytes({reinterpret_cast<const char*>(data), size});
  return 0;
}
