// One argument parser for every subcommand: options with a value (`--attempt 3`, `--attempt=3`),
// flags, `--` (what follows is operands, or `run`'s command), `--help`/`-h`, and one line for a
// mistake. Each subcommand describes its options as a table; what they mean stays in its file.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace ncclwatch {
namespace cli {

struct Option {
  const char* name;   // "--attempt"
  const char* alias;  // "-o", or nullptr
  // nullptr: a flag. Otherwise what the value is, for "NAME needs VALUE" when it is missing.
  const char* value;
  // Given the value (nullptr for a flag). Returns "" when taken, else the line that says why not.
  std::function<std::string(const char* value)> take;
};

// A flag's `take` that sets *target to `value`.
template <typename T, typename U>
std::function<std::string(const char*)> SetTo(T* target, U value) {
  return [target, value](const char*) {
    *target = static_cast<T>(value);
    return std::string();
  };
}

struct ArgSpec {
  const char* sub;                // the subcommand's name, for its lines
  void (*help)(std::FILE* out);   // printed on --help / -h before any "--"
  std::vector<Option> options;
  // The words that are not options, e.g. "directory": "no directory given", "more than one
  // directory given". nullptr: the command takes none (`run`: the words after "--" are the
  // command to start).
  const char* operand = nullptr;
  bool operand_optional = false;
  const char* unknown_hint = "";  // added after "unknown option 'X'"
};

struct ParsedArgs {
  // -1: parsed, go on. Otherwise the exit status to return now (help printed: 0; a usage
  // error, said in one line: kExitBadInput).
  int exit_status = -1;
  std::string operand;  // "" when none was given (operand_optional)
  int command = 0;      // no operand spec: argv index of the command after "--" (0: none)
};

// argv[0] is the subcommand's name. Help goes to `out`, mistakes to `err`.
ParsedArgs ParseArgs(const ArgSpec& spec, int argc, char** argv, std::FILE* out = stdout, std::FILE* err = stderr);

// Prints "ncclwatch SUB: MESSAGE (see `ncclwatch SUB --help`)" to `err`, one line; returns
// kExitBadInput.
int UsageError(const char* sub, const std::string& message, std::FILE* err = stderr);

// The value of `--attempt N`: from 1 (the oldest attempt). "" when taken.
std::string TakeAttempt(const char* value, int* attempt);

}  // namespace cli
}  // namespace ncclwatch
