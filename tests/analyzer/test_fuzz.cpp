// Robustness of the dump reader: a seeded random mutator over real-looking dumps (always run),
// and every input kept under fuzz-regressions/ (crashes found by fuzz.sh, edge cases).
#include <filesystem>
#include <random>

#include <catch2/catch.hpp>

#include "format/dump_reader.h"
#include "format/trace_writer.h"
#include "fuzz_harness.h"
#include "fixtures.h"

using namespace ncclwatch::testing;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> SeedInputs() {
  std::vector<std::string> seeds;
  for (const char* set : {"rank_missing", "p2p_unmatched", "mismatch"})
    for (const auto& e : fs::directory_iterator(fs::path(GOLDEN_DIR) / set))
      if (e.path().filename().string().rfind("rank0000", 0) == 0 && seeds.size() < 9)
        seeds.push_back(ReadFile(e.path().string()));
  // The golden sets are version 1 dumps: the same rewritten by today's writer (version 2's
  // ring rows and shapes, module table) give the mutator the new reader paths too.
  for (size_t i = 0, n = seeds.size(); i < n; ++i) {
    ncclwatch::trace::LoadedDump d;
    if (!ncclwatch::trace::ReadDumpBuffer(seeds[i], ncclwatch::trace::ReadDepth::kFull, &d).usable || !d.detail) continue;
    ncclwatch::trace::Document doc;
    doc.summary = d.summary;
    doc.detail = *d.detail;
    seeds.push_back(ncclwatch::trace::WriteDocument(doc));
  }
  return seeds;
}

// Byte-level damage: flips, cuts, splices, runs of odd characters.
std::string MutateBytes(std::string s, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n ? static_cast<size_t>(rng() % n) : 0; };
  int edits = 1 + static_cast<int>(rng() % 8);
  for (int i = 0; i < edits && !s.empty(); ++i) {
    size_t at = pick(s.size());
    switch (rng() % 7) {
      case 0: s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8))); break;
      case 1: s.resize(at); break;
      case 2: s.erase(at, 1 + pick(64)); break;
      case 3: s.insert(at, s.substr(pick(s.size()), pick(256))); break;
      case 4: s.insert(at, std::string(1 + pick(32), "{}[]\",:0-e9\\u"[rng() % 14])); break;
      case 5: s[at] = static_cast<char>(rng() % 256); break;
      default: s.insert(at, "99999999999999999999"); break;
    }
  }
  return s;
}

// Structure-level damage: valid JSON whose values have the wrong type, sign or size.
void MutateValues(json& j, std::mt19937_64& rng, int depth = 0) {
  static const json odd[] = {nullptr, -1, 0, 2147483648LL, -9223372036854775807LL, 1e308, "x", json::array(),
                             json::object(), true, 18446744073709551615ULL};
  if (j.is_object() || j.is_array()) {
    for (auto& v : j) {
      if (rng() % 23 == 0) v = odd[rng() % (sizeof odd / sizeof odd[0])];
      else if (depth < 12) MutateValues(v, rng, depth + 1);
    }
  }
}

}  // namespace

TEST_CASE("seeded random mutations never crash the reader or the analysis", "[fuzz]") {
  auto seeds = SeedInputs();
  REQUIRE(seeds.size() >= 3);
  std::mt19937_64 rng(20241121);
#if defined(__SANITIZE_ADDRESS__)
  const int mutations = 600;  // ten times slower under AddressSanitizer; the main build tries 1500
#else
  const int mutations = 1500;
#endif
  for (int i = 0; i < mutations; ++i) {
    const std::string& seed = seeds[static_cast<size_t>(i) % seeds.size()];
    std::string input;
    if (i % 3 == 0) {
      json j = json::parse(seed);
      MutateValues(j, rng);
      input = j.dump();
    } else {
      input = MutateBytes(seed, rng);
    }
    INFO("iteration " << i);
    REQUIRE_NOTHROW(ExerciseDumpBytes(input));
  }
}

TEST_CASE("inputs kept in fuzz-regressions never crash", "[fuzz]") {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(FUZZ_REGRESSIONS_DIR)) {
    if (!e.is_regular_file() || e.path().filename() == "README.md") continue;
    INFO(e.path().string());
    REQUIRE_NOTHROW(ExerciseDumpBytes(ReadFile(e.path().string())));
    ++n;
  }
  CHECK(n > 0);
}
