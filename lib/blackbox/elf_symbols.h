// Function names from an object file on disk, for the host's caretaker: a dead process's call
// sites are raw addresses (black_box.h) that only the files it had loaded can name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ncclwatch {
namespace blackbox {

class ElfSymbols {
 public:
  // The function symbols of `path` (.symtab, else .dynsym), when the file is a readable ELF
  // object whose build id is `build_id` (unchecked when `build_id` is empty; a file of another
  // build names nothing). Bounded: files over 4 GiB or a million symbols are not read.
  static ElfSymbols Read(const std::string& path, const std::string& build_id);

  // The function holding `address` (an address in the file's own terms: a runtime address minus
  // the load bias): its demangled name and start; false when none does.
  bool Find(uint64_t address, std::string* name, uint64_t* start) const;
  bool usable() const { return !functions_.empty(); }

 private:
  struct Function {
    uint64_t start, size;
    std::string name;
  };
  std::vector<Function> functions_;  // sorted by start
};

// ElfSymbols per file, read once per caretaker pass.
class ElfSymbolCache {
 public:
  const ElfSymbols& Of(const std::string& path, const std::string& build_id);

 private:
  std::map<std::pair<std::string, std::string>, ElfSymbols> files_;
};

}  // namespace blackbox
}  // namespace ncclwatch
