// A stripped shared library for the stack tests (linked with -s: no .symtab, only the exported
// symbols of .dynsym). Its one static function follows an exported one, so the nearest exported
// symbol of an address in it is the wrong name that symbolization must not give.
#include <cstdint>

extern "C" __attribute__((visibility("default"), noinline)) int nw_module_exported(int x) {
  asm volatile("" ::: "memory");
  return x + 1;
}

namespace {

// Calls `capture(0, depth)` (CaptureCallsite itself): the call site's frame 0 is this function.
__attribute__((noinline)) int HiddenAfterExported(int32_t (*capture)(int, int), int depth) {
  const int id = capture(0, depth);
  asm volatile("" ::: "memory");  // not a tail call: this frame stays
  return id;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) uintptr_t nw_module_hidden_function() {
  return reinterpret_cast<uintptr_t>(&HiddenAfterExported);
}

extern "C" __attribute__((visibility("default"), noinline)) int nw_module_calls(int32_t (*capture)(int, int),
                                                                                  int depth) {
  const int id = HiddenAfterExported(capture, depth);
  asm volatile("" ::: "memory");
  return id;
}
