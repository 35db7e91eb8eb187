// Symbolize: names only where they are right, and every frame's module, build id and module
// offset; ncclwatch's own frames dropped from the top of call sites.
#define UNW_LOCAL_ONLY
#include <dlfcn.h>
#include <elf.h>
#include <libunwind.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "stacks.h"
#include "call_sites.h"

using namespace ncclwatch::stacks;

// tests/stacks/stripped_module.cpp: a stripped library.
extern "C" int nw_module_exported(int x);
extern "C" uintptr_t nw_module_hidden_function();
extern "C" int nw_module_calls(int32_t (*capture)(int, int), int depth);

namespace {

// NT_GNU_BUILD_ID of an ELF64 file, read from the file itself (not from memory, as Symbolize does).
std::string BuildIdFromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Elf64_Ehdr header;
  if (file.size() < sizeof header) return "no file";
  std::memcpy(&header, file.data(), sizeof header);
  for (int i = 0; i < header.e_phnum; ++i) {
    Elf64_Phdr segment;
    std::memcpy(&segment, file.data() + header.e_phoff + i * sizeof segment, sizeof segment);
    if (segment.p_type != PT_NOTE) continue;
    for (size_t at = segment.p_offset; at + sizeof(Elf64_Nhdr) <= segment.p_offset + segment.p_filesz;) {
      Elf64_Nhdr note;
      std::memcpy(&note, file.data() + at, sizeof note);
      const size_t name = at + sizeof note, desc = name + ((note.n_namesz + 3) & ~3u);
      if (note.n_type == NT_GNU_BUILD_ID && std::strcmp(file.data() + name, "GNU") == 0) {
        std::string hex;
        for (size_t b = 0; b < note.n_descsz; ++b) {
          char digits[3];
          std::snprintf(digits, sizeof digits, "%02x", static_cast<unsigned char>(file[desc + b]));
          hex += digits;
        }
        return hex;
      }
      at = desc + ((note.n_descsz + 3) & ~3u);
    }
  }
  return "none";
}

uintptr_t ModuleBase(uintptr_t address) {
  Dl_info info;
  REQUIRE(dladdr(reinterpret_cast<void*>(address), &info) != 0);
  return reinterpret_cast<uintptr_t>(info.dli_fbase);
}

Callsite Get(int32_t id) {
  Callsite callsite;
  REQUIRE(GetCallsite(id, &callsite));
  return callsite;
}

}  // namespace

TEST_CASE("an address past the end of the nearest exported symbol is module+offset, never that symbol's name") {
  const uintptr_t hidden = nw_module_hidden_function();
  // The premise: in a stripped library, the nearest symbol there is (libunwind's lookup, which
  // reads .dynsym when there is no .symtab) is the exported function before it.
  char name[256];
  unw_word_t offset = 0;
  unw_accessors_t* accessors = unw_get_accessors(unw_local_addr_space);
  REQUIRE(accessors->get_proc_name(unw_local_addr_space, hidden + 3, name, sizeof name, &offset, nullptr) == 0);
  REQUIRE(std::string(name) == "nw_module_exported");
  REQUIRE(offset > 3);

  const uintptr_t return_address = hidden + 4;  // inside the static function
  const NativeFrame frame = Symbolize(return_address);
  CHECK(frame.symbol.empty());
  CHECK(frame.module.find("libstacks_test_module.so") != std::string::npos);
  CHECK(frame.offset == return_address - ModuleBase(hidden));

  // A real return address into it, from a call site.
  const Callsite site = Get(nw_module_calls(&CaptureCallsite, 16));
  REQUIRE(!site.ips.empty());
  CHECK(Symbolize(site.ips[0]).symbol.empty());
  CHECK(Symbolize(site.ips[0]).module == frame.module);
  CHECK(Symbolize(site.ips[1]).symbol == "nw_module_calls");  // inside an exported function: named

  CHECK(Symbolize(reinterpret_cast<uintptr_t>(&nw_module_exported) + 2).symbol == "nw_module_exported");
}

TEST_CASE("every native frame carries its module's build id and its offset in the module") {
  const uintptr_t hidden = nw_module_hidden_function() + 4;
  const NativeFrame in_library = Symbolize(hidden);
  CHECK(in_library.build_id.size() == 40);  // GNU ld's default, sha1
  CHECK(in_library.build_id == BuildIdFromFile(in_library.module));
  CHECK(in_library.module_offset == hidden - ModuleBase(hidden));  // its first PT_LOAD is at 0

  const Callsite site = Get(stacks_test::CaptureAtSiteA(16));
  const NativeFrame in_program = Symbolize(site.ips[0]);
  CHECK(in_program.symbol == "stacks_test::CaptureAtSiteA(int)");
  CHECK(in_program.module.front() == '/');  // the program's path, not argv[0]
  CHECK(in_program.module.find("test_stacks") != std::string::npos);
  CHECK(in_program.build_id == BuildIdFromFile(in_program.module));
  CHECK(in_program.module_offset == site.ips[0] - ModuleBase(site.ips[0]));  // a PIE
  CHECK(in_program.module_offset != in_library.module_offset);

  CHECK(Symbolize(0).module.empty());
  CHECK(Symbolize(0).build_id.empty());
}

TEST_CASE("ncclwatch's own frames are dropped from the top of call sites, never all of them") {
  const int32_t id = nw_module_calls(&CaptureCallsite, 16);
  STACKS_KEEP_FRAME();
  const Callsite whole = Get(id);
  REQUIRE(whole.ips.size() >= 3);
  const std::string module = Symbolize(whole.ips[0]).module;
  REQUIRE(Symbolize(whole.ips[1]).module == module);
  REQUIRE(Symbolize(whole.ips[2]).module != module);

  SetOwnModule(reinterpret_cast<const void*>(&nw_module_calls));  // as if it were libncclwatch.so
  const Callsite trimmed = Get(id);
  CHECK(IsOwnFrame(whole.ips[0]));
  CHECK(!IsOwnFrame(whole.ips[2]));
  const std::vector<uintptr_t> own_only(whole.ips.begin(), whole.ips.begin() + 2);
  CHECK(WithoutOwnFrames(own_only) == own_only);
  SetOwnModule(nullptr);

  CHECK(trimmed.ips == std::vector<uintptr_t>(whole.ips.begin() + 2, whole.ips.end()));
  CHECK(Get(id).ips == whole.ips);  // no own module, nothing dropped
}

namespace {
// Two static functions side by side: the byte before the second's first is the first's.
__attribute__((noinline)) int BeforeFaultTarget(int x) { return x * 3 + 1; }
__attribute__((noinline)) int FaultTarget(int x) { return x * 5 + 2; }
}  // namespace

TEST_CASE("an interrupted instruction is symbolized as it is: a fault on a function's first byte names it") {
  REQUIRE(BeforeFaultTarget(1) + FaultTarget(1) == 11);
  const uintptr_t first_byte = reinterpret_cast<uintptr_t>(&FaultTarget);
  const NativeFrame faulting = Symbolize(first_byte, /*interrupted=*/true);
  CHECK(faulting.interrupted);
  CHECK(faulting.symbol.find("FaultTarget") != std::string::npos);
  CHECK(faulting.symbol.find("BeforeFaultTarget") == std::string::npos);
  CHECK(faulting.offset == 0);
  CHECK(faulting.module_offset == first_byte - ModuleBase(first_byte));
  // As a return address the same value is the end of whatever came before: never FaultTarget.
  const NativeFrame returned = Symbolize(first_byte);
  CHECK_FALSE(returned.interrupted);
  CHECK(returned.symbol != faulting.symbol);
  // Both lookups of one address are cached apart.
  CHECK(Symbolize(first_byte, true).symbol == faulting.symbol);
}
