// The subcommands' one argument parser: options with values (spaced and --name=value), flags,
// "--", --help, operands, and one line for every mistake.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "command_line.h"
#include "subcommand.h"

using namespace ncclwatch::cli;

namespace {

// Captures what the parser prints.
struct Capture {
  char* buf = nullptr;
  size_t size = 0;
  std::FILE* f = open_memstream(&buf, &size);
  std::string Text() {
    std::fflush(f);
    return std::string(buf, size);
  }
  ~Capture() {
    std::fclose(f);
    std::free(buf);
  }
};

void TestHelp(std::FILE* out) { std::fprintf(out, "usage: ncclwatch test DIR\n"); }

struct Parse {
  bool flag = false;
  int attempt = 0;
  std::string output = "default";
  Capture out, err;
  ParsedArgs result;

  Parse(std::vector<std::string> words, const char* operand = "directory", bool optional = false) {
    const ArgSpec spec = {"test", TestHelp,
                          {{"--flag", "-f", nullptr, SetTo(&flag, true)},
                           {"--attempt", nullptr, "a number from 1 (the oldest attempt)",
                            [this](const char* v) { return TakeAttempt(v, &attempt); }},
                           {"--output", "-o", "a file name", [this](const char* v) {
                              output = v;
                              return std::string();
                            }}},
                          operand, optional, " (a hint)"};
    words.insert(words.begin(), "test");
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(&w[0]);
    argv.push_back(nullptr);
    result = ParseArgs(spec, static_cast<int>(words.size()), argv.data(), out.f, err.f);
  }
  // The one line of a mistake, without its newline.
  std::string Line() {
    std::string e = err.Text();
    CHECK(std::count(e.begin(), e.end(), '\n') == 1);
    return e;
  }
};

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("options with values, flags and the operand, in any order", "[command_line]") {
  Parse p({"-o", "out.json", "dir", "--flag", "--attempt", "3"});
  CHECK(p.result.exit_status == -1);
  CHECK(p.result.operand == "dir");
  CHECK(p.flag);
  CHECK(p.attempt == 3);
  CHECK(p.output == "out.json");
  CHECK(p.err.Text().empty());

  Parse q({"--attempt=2", "--output=a=b", "dir"});
  CHECK(q.result.exit_status == -1);
  CHECK(q.attempt == 2);
  CHECK(q.output == "a=b");  // split at the first '='
}

TEST_CASE("after --, every word is an operand", "[command_line]") {
  Parse p({"--flag", "--", "-dir-with-a-dash"});
  CHECK(p.result.exit_status == -1);
  CHECK(p.result.operand == "-dir-with-a-dash");
  Parse q({"--", "--help"});  // a directory named --help, not help
  CHECK(q.result.exit_status == -1);
  CHECK(q.result.operand == "--help");
  CHECK(q.out.Text().empty());
}

TEST_CASE("--help and -h print the help and end with 0, whatever else is there", "[command_line]") {
  for (auto words : {std::vector<std::string>{"--help"}, {"dir", "-h"}, {"--bogus", "--help"}}) {
    Parse p(words);
    CHECK(p.result.exit_status == kExitOk);
    CHECK(Has(p.out.Text(), "usage: ncclwatch test DIR"));
    CHECK(p.err.Text().empty());
  }
}

TEST_CASE("every mistake is one line that names it and where help is, exit status 2", "[command_line]") {
  struct Case {
    std::vector<std::string> words;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {{"--bogus", "dir"}, "ncclwatch test: unknown option '--bogus' (a hint)"},
           {{"dir", "-x"}, "unknown option '-x'"},
           {{}, "no directory given"},
           {{"a", "b"}, "more than one directory given"},
           {{"dir", "--attempt"}, "--attempt needs a number from 1 (the oldest attempt)"},
           {{"dir", "--attempt", "0"}, "--attempt needs a number from 1 (the oldest attempt)"},
           {{"dir", "--attempt", "2x"}, "--attempt needs a number from 1"},
           {{"dir", "--attempt="}, "--attempt needs a number from 1"},
           {{"dir", "-o"}, "-o needs a file name"},
           {{"dir", "--flag=1"}, "--flag takes no value"},
           {{"--bogus\x1b[2J"}, "unknown option '--bogus\\x1b[2J'"},  // escaped: never a terminal sequence
       }) {
    INFO(c.says);
    Parse p(c.words);
    CHECK(p.result.exit_status == kExitBadInput);
    const std::string line = p.Line();
    CHECK(Has(line, c.says));
    CHECK(Has(line, "(see `ncclwatch test --help`)"));
    CHECK(p.out.Text().empty());
  }
}

TEST_CASE("an optional operand may be left out", "[command_line]") {
  Parse p({"--flag"}, "directory", /*optional=*/true);
  CHECK(p.result.exit_status == -1);
  CHECK(p.result.operand.empty());
}

TEST_CASE("a command after --: run's form", "[command_line]") {
  Parse p({"--flag", "--", "python", "--flag", "-h"}, nullptr);
  CHECK(p.result.exit_status == -1);
  CHECK(p.result.command == 3);  // argv index of "python": what follows is the job's
  CHECK(p.flag);
  CHECK(p.out.Text().empty());  // -h after -- is the job's

  Parse bare({"python"}, nullptr);
  CHECK(bare.result.exit_status == kExitBadInput);
  CHECK(Has(bare.Line(), "unknown option 'python' (a hint)"));
  Parse none({"--flag", "--"}, nullptr);
  CHECK(none.result.exit_status == kExitBadInput);
  CHECK(Has(none.Line(), "no command given: ncclwatch test [options] -- COMMAND ..."));
}
