#include "command_line.h"

#include <cstdlib>
#include <cstring>

#include "format/display.h"
#include "subcommand.h"

namespace ncclwatch {
namespace cli {

int UsageError(const char* sub, const std::string& message, std::FILE* err) {
  std::fprintf(err, "ncclwatch %s: %s (see `ncclwatch %s --help`)\n", sub, message.c_str(), sub);
  return kExitBadInput;
}

std::string TakeAttempt(const char* value, int* attempt) {
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (!*value || !end || *end || n < 1 || n > 1000000) return "--attempt needs a number from 1 (the oldest attempt)";
  *attempt = static_cast<int>(n);
  return "";
}

ParsedArgs ParseArgs(const ArgSpec& spec, int argc, char** argv, std::FILE* out, std::FILE* err) {
  ParsedArgs parsed;
  // Help wins over any mistake before it, and only before "--": after it the words are operands
  // or the job's.
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      spec.help(out);
      parsed.exit_status = kExitOk;
      return parsed;
    }
  auto fail = [&](const std::string& message) {
    parsed.exit_status = UsageError(spec.sub, trace::PrintableCut(message, 300), err);
    return parsed;
  };
  const std::string operand = spec.operand ? spec.operand : "";
  bool operands_only = false;
  bool have_operand = false;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (!operands_only && std::strcmp(arg, "--") == 0) {
      if (!spec.operand) {  // the command follows
        if (i + 1 >= argc) break;
        parsed.command = i + 1;
        return parsed;
      }
      operands_only = true;
      continue;
    }
    if (!operands_only && arg[0] == '-' && arg[1] != '\0') {
      // --name=value is --name value.
      std::string name = arg;
      const char* inline_value = nullptr;
      if (name.rfind("--", 0) == 0 && name.find('=') != std::string::npos) {
        inline_value = arg + name.find('=') + 1;
        name = name.substr(0, name.find('='));
      }
      const Option* o = nullptr;
      for (const Option& c : spec.options)
        if (name == c.name || (c.alias && name == c.alias)) o = &c;
      if (!o) return fail("unknown option '" + std::string(arg) + "'" + spec.unknown_hint);
      const char* value = nullptr;
      if (o->value) {
        value = inline_value ? inline_value : i + 1 < argc ? argv[++i] : nullptr;
        if (!value) return fail(name + " needs " + o->value);
      } else if (inline_value) {
        return fail(name + " takes no value");
      }
      const std::string why = o->take(value);
      if (!why.empty()) return fail(why);
      continue;
    }
    if (!spec.operand) return fail("unknown option '" + std::string(arg) + "'" + spec.unknown_hint);
    if (have_operand) return fail("more than one " + operand + " given");
    parsed.operand = arg;
    have_operand = true;
  }
  if (spec.operand && !have_operand && !spec.operand_optional) return fail("no " + operand + " given");
  if (!spec.operand && !parsed.command) return fail(std::string("no command given: ncclwatch ") + spec.sub + " [options] -- COMMAND ...");
  return parsed;
}

}  // namespace cli
}  // namespace ncclwatch
