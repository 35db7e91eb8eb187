// One input through everything that reads untrusted dump bytes: the reader at both depths,
// attribution over a set holding it, and every renderer. Shared by the seeded mutator test,
// the regression test and the libFuzzer target (fuzz.sh).
#pragma once

#include <string_view>

namespace ncclwatch {
namespace testing {

// Must never crash, throw or hang, whatever the bytes.
void ExerciseDumpBytes(std::string_view bytes);

}  // namespace testing
}  // namespace ncclwatch
