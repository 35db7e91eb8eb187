#include "call_sites.h"

#include <algorithm>

#include "stacks.h"

using ncclwatch::stacks::CaptureCallsite;

namespace stacks_test {

int32_t CaptureAtSiteA(int max_depth) {
  const int32_t id = CaptureCallsite(0, max_depth);
  STACKS_KEEP_FRAME();
  return id;
}

int32_t CaptureAtSiteB(int max_depth) {
  const int32_t id = CaptureCallsite(0, max_depth);
  STACKS_KEEP_FRAME();
  return id;
}

int32_t CaptureSkippingSelf() {
  const int32_t id = CaptureCallsite(1, 8);
  STACKS_KEEP_FRAME();
  return id;
}

STACKS_TEST_SITE int32_t ViaMiddle() {
  const int32_t id = CaptureAtSiteA(16);
  STACKS_KEEP_FRAME();
  return id;
}

__attribute__((no_icf)) int32_t ViaOuterA() {
  const int32_t id = ViaMiddle();
  STACKS_KEEP_FRAME();
  return id;
}

__attribute__((no_icf)) int32_t ViaOuterB() {
  const int32_t id = ViaMiddle();
  STACKS_KEEP_FRAME();
  return id;
}

STACKS_TEST_SITE int32_t PathLeft(unsigned path, int levels) {
  const int32_t id = CaptureOnPath(path, levels);
  STACKS_KEEP_FRAME();
  return id;
}

STACKS_TEST_SITE int32_t PathRight(unsigned path, int levels) {
  const int32_t id = CaptureOnPath(path, levels);
  STACKS_KEEP_FRAME();
  return id;
}

int32_t CaptureOnPath(unsigned path, int levels) {
  if (levels == 0) return CaptureCallsite(0, ncclwatch::stacks::kMaxNativeFrames);
  return (path & 1) ? PathRight(path >> 1, levels - 1) : PathLeft(path >> 1, levels - 1);
}

std::vector<std::string> SymbolsOf(const std::vector<uintptr_t>& ips) {
  std::vector<std::string> symbols;
  for (uintptr_t ip : ips) symbols.push_back(ncclwatch::stacks::Symbolize(ip).symbol);
  return symbols;
}

bool StackContains(const std::vector<uintptr_t>& ips, const std::string& function) {
  const std::vector<std::string> symbols = SymbolsOf(ips);
  return std::any_of(symbols.begin(), symbols.end(),
                     [&](const std::string& symbol) { return symbol.find(function) != std::string::npos; });
}

}  // namespace stacks_test
