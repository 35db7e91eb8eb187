// Function names from an object file on disk, for the host's caretaker: a dead process's call
// sites are raw addresses (black_box.h) that only the files it had loaded can name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ncclwatch {
namespace blackbox {

struct ElfFunction {
  std::string name;  // demangled
  uint64_t start = 0;
};

// The functions holding `addresses` (in the file's own terms: a runtime address minus the load
// bias) in `path`'s symbol table (.symtab, else .dynsym), when the file is a readable ELF object
// whose build id is `build_id` (unchecked when empty; a file of another build names nothing).
// One pass over the table whatever the number of addresses; memory is the answer's: the table
// itself is only mapped (a caretaker runs inside some rank). Files over 4 GiB are not read.
std::map<uint64_t, ElfFunction> FunctionsAt(const std::string& path, const std::string& build_id,
                                           std::vector<uint64_t> addresses);

}  // namespace blackbox
}  // namespace ncclwatch
