#include <catch2/catch.hpp>

#include <csignal>
#include <map>
#include <string>

#include "common/config.h"

using namespace ncclwatch;

namespace {
std::map<std::string, std::string> g_env;
const char* FakeEnv(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}
ConfigResult Parse(std::map<std::string, std::string> env) {
  g_env = std::move(env);
  return ParseConfig(&FakeEnv);
}
}  // namespace

TEST_CASE("defaults apply when nothing is set") {
  auto r = Parse({});
  CHECK(r.errors.empty());
  CHECK(r.config.ring == 4096);
  CHECK(r.config.poll_ms == 100);
  CHECK(r.config.timeout.default_s == 60.0);
  CHECK(r.config.dump_signal == SIGUSR2);
  CHECK(r.config.stack_signal == SIGRTMIN + 5);
  CHECK_FALSE(r.config.gpu_timing);
  CHECK(r.config.callsites);
}

TEST_CASE("valid values are taken") {
  auto r = Parse({{"NCCLWATCH_RING", "1000"},
                  {"NCCLWATCH_GPU_TIMING", "yes"},
                  {"NCCLWATCH_DUMP_SIGNAL", "SIGUSR1"},
                  {"NCCLWATCH_LOG", "debug"},
                  {"NCCLWATCH_DIR", "/tmp/x"},
                  {"NCCLWATCH_ADAPTIVE_FLOOR", "2.5"}});
  CHECK(r.errors.empty());
  CHECK(r.config.ring == 1024);  // rounded up to a power of two
  CHECK(r.config.gpu_timing);
  CHECK(r.config.dump_signal == SIGUSR1);
  CHECK(r.config.log == LogLevel::kDebug);
  CHECK(r.config.dir == "/tmp/x");
  CHECK(r.config.adaptive_floor_s == 2.5);
}

TEST_CASE("an invalid value gives one line naming the variable, and the default is used") {
  auto r = Parse({{"NCCLWATCH_RING", "lots"}, {"NCCLWATCH_GPU_TIMING", "maybe"}, {"NCCLWATCH_POLL_MS", "0"}});
  REQUIRE(r.errors.size() == 3);
  CHECK(r.errors[0].find("NCCLWATCH_RING='lots'") != std::string::npos);
  CHECK(r.errors[0].find("4096") != std::string::npos);
  CHECK(r.config.ring == 4096);
  CHECK_FALSE(r.config.gpu_timing);
  CHECK(r.config.poll_ms == 100);
}

TEST_CASE("NCCLWATCH_TIMEOUT: plain seconds and per-operation lists") {
  DeadlineSpec s;
  std::string err;
  REQUIRE(ParseDeadlineSpec("300", &s, &err));
  CHECK(s.default_s == 300);
  REQUIRE(ParseDeadlineSpec("AllGather=120, Send=600,default=30", &s, &err));
  CHECK(s.default_s == 30);
  CHECK(s.per_op_s[static_cast<int>(trace::OpKind::AllGather)] == 120);
  CHECK(s.per_op_s[static_cast<int>(trace::OpKind::Send)] == 600);
  CHECK(s.per_op_s[static_cast<int>(trace::OpKind::AllReduce)] == 0);
  CHECK(ParseDeadlineSpec("allreduce=5", &s, &err));  // case-insensitive
  CHECK(s.per_op_s[static_cast<int>(trace::OpKind::AllReduce)] == 5);
  CHECK_FALSE(ParseDeadlineSpec("Allgathr=120", &s, &err));
  CHECK(err.find("unknown operation 'Allgathr'") != std::string::npos);
  CHECK_FALSE(ParseDeadlineSpec("AllGather=-1", &s, &err));
  CHECK_FALSE(ParseDeadlineSpec("soon", &s, &err));
  auto r = Parse({{"NCCLWATCH_TIMEOUT", "Bogus=1"}});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.config.timeout.default_s == 60);
}

TEST_CASE("signals by name, number, real-time offset or none") {
  int s = 0;
  std::string err;
  CHECK((ParseSignal("SIGUSR2", &s, &err) && s == SIGUSR2));
  CHECK((ParseSignal("usr1", &s, &err) && s == SIGUSR1));
  CHECK((ParseSignal("12", &s, &err) && s == 12));
  CHECK((ParseSignal("RTMIN+3", &s, &err) && s == SIGRTMIN + 3));
  CHECK((ParseSignal("SIGRTMAX-1", &s, &err) && s == SIGRTMAX - 1));
  CHECK((ParseSignal("none", &s, &err) && s == 0));
  CHECK_FALSE(ParseSignal("SIGFOO", &s, &err));
  CHECK_FALSE(ParseSignal("RTMIN+999", &s, &err));
  CHECK((ParseSignal("SIGWINCH", &s, &err) && s == SIGWINCH));  // every name the C library knows
  CHECK((ParseSignal("term", &s, &err) && s == SIGTERM));
}

TEST_CASE("a dump signal that is the stack signal gives one line about the dump signal") {
  auto r = Parse({{"NCCLWATCH_DUMP_SIGNAL", "SIGRTMIN+5"}});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].rfind("NCCLWATCH_DUMP_SIGNAL='SIGRTMIN+5': is the signal ncclwatch samples stacks with", 0) == 0);
  CHECK(r.errors[0].find("(SIGUSR2)") != std::string::npos);
  CHECK(r.config.dump_signal == SIGUSR2);
  CHECK(r.config.stack_signal == SIGRTMIN + 5);
  // Both moved onto the default dump signal: stack sampling keeps it, on-demand dumps are off.
  r = Parse({{"NCCLWATCH_STACK_SIGNAL", "SIGUSR2"}});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.config.stack_signal == SIGUSR2);
  CHECK(r.config.dump_signal == 0);
}

TEST_CASE("terminating, fatal and job-control signals are never taken over for dumps or stacks") {
  for (const char* v : {"15", "SIGTERM", "SIGINT", "9", "SIGKILL", "SIGHUP", "SIGQUIT", "SIGSEGV", "SIGABRT",
                        "SIGCHLD", "SIGSTOP", "SIGCONT", "SIGPROF", "SIGALRM", "SIGPIPE"}) {
    for (const char* var : {"NCCLWATCH_DUMP_SIGNAL", "NCCLWATCH_STACK_SIGNAL"}) {
      INFO(var << "=" << v);
      auto r = Parse({{var, v}});
      REQUIRE(r.errors.size() == 1);
      CHECK(r.errors[0].find("is never taken over") != std::string::npos);
      CHECK(r.errors[0].find("already handles") == std::string::npos);
      CHECK(r.config.dump_signal == SIGUSR2);
      CHECK(r.config.stack_signal == SIGRTMIN + 5);
    }
  }
  CHECK(Parse({{"NCCLWATCH_DUMP_SIGNAL", "SIGUSR1"}}).errors.empty());
  CHECK(Parse({{"NCCLWATCH_DUMP_SIGNAL", "RTMIN+2"}}).errors.empty());
}

TEST_CASE("out-of-range seconds name the real range, a multiplier is called one") {
  auto r = Parse({{"NCCLWATCH_TIMEOUT", "1e99"}});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("above 0 and at most 10000000") != std::string::npos);
  r = Parse({{"NCCLWATCH_TIMEOUT", "AllReduce=1e99"}});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("at most 10000000") != std::string::npos);
  r = Parse({{"NCCLWATCH_ADAPTIVE_FLOOR", "1e99"}});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("from 0 to 10000000") != std::string::npos);
  r = Parse({{"NCCLWATCH_ADAPTIVE", "-1"}});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("multiplier") != std::string::npos);
  CHECK(r.errors[0].find("seconds") == std::string::npos);
  CHECK(r.config.adaptive == 20.0);
  r = Parse({{"NCCLWATCH_ADAPTIVE", "2.5"}});
  CHECK(r.errors.empty());
  CHECK(r.config.adaptive == 2.5);
}

TEST_CASE("every setting is described for dumps and docs") {
  auto d = DescribeConfig(Config{});
  std::map<std::string, std::string> m(d.begin(), d.end());
  for (const char* v : {"NCCLWATCH_DISABLE", "NCCLWATCH_DIR", "NCCLWATCH_RING", "NCCLWATCH_TIMEOUT",
                        "NCCLWATCH_DUMP_SIGNAL", "NCCLWATCH_GPU_TIMING", "NCCLWATCH_MAX_DUMPS"})
    CHECK(m.count(v) == 1);
  CHECK(m["NCCLWATCH_DUMP_SIGNAL"] == "SIGUSR2");
  CHECK(m["NCCLWATCH_TIMEOUT"] == "default=60");
}

#include <fstream>
#include <sstream>

TEST_CASE("the README documents every NCCLWATCH_ variable with its default") {
  std::ifstream f(std::string(NCCLWATCH_SOURCE_DIR) + "/README.md");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string readme = ss.str();
  REQUIRE(!readme.empty());
  for (auto& kv : DescribeConfig(Config{})) {
    INFO(kv.first);
    size_t row = readme.find("| `" + kv.first + "` |");
    REQUIRE(row != std::string::npos);
    std::string line = readme.substr(row, readme.find('\n', row) - row);
    std::string dflt = kv.first == "NCCLWATCH_TIMEOUT" ? "60" : kv.second;
    if (kv.first == "NCCLWATCH_DIR") dflt = "./ncclwatch-<job id>";
    if (dflt.empty()) dflt = "unset";  // a setting that is off unless given
    CHECK(line.find("`" + dflt + "`") != std::string::npos);
  }
}

TEST_CASE("signals the C library reserves are refused in one line, none for stacks is said") {
  auto r = Parse({{"NCCLWATCH_STACK_SIGNAL", "32"}, {"NCCLWATCH_DUMP_SIGNAL", "33"}});
  REQUIRE(r.errors.size() == 2);
  CHECK(r.config.stack_signal == SIGRTMIN + 5);
  CHECK(r.config.dump_signal == SIGUSR2);
  for (const auto& e : r.errors) CHECK(e.find("reserved by the C library") != std::string::npos);
  r = Parse({{"NCCLWATCH_STACK_SIGNAL", "none"}});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find("NCCLWATCH_STACK_SIGNAL='none': no signal to sample threads with") == 0);
  CHECK(r.errors[0].find("no thread's native stack") != std::string::npos);
  CHECK(r.config.stack_signal == 0);
  CHECK(Parse({{"NCCLWATCH_STACK_SIGNAL", "none"}, {"NCCLWATCH_STACKS", "0"}}).errors.empty());
  CHECK(Parse({{"NCCLWATCH_DUMP_SIGNAL", "none"}}).errors.empty());  // documented: on-demand dumps off
}

TEST_CASE("NCCLWATCH_ variables that are no setting are named, with the setting meant") {
  std::vector<std::string> env_text = {"NCCLWATCH_TIMOUT=30", "NCCLWATCH_RING=64", "NCCLWATCH_STAKCS=0",
                                       "NCCLWATCH_WHATEVER_ELSE=1", "NCCLWATCH_LIB=/x/libncclwatch.so",
                                       "NCCLWATCH_SIM_LOG=1", "PATH=/bin", "NCCLWATCH_EVIL\x1b[2J=1"};
  std::vector<const char*> envp;
  for (const auto& e : env_text) envp.push_back(e.c_str());
  envp.push_back(nullptr);
  g_env = {{"NCCLWATCH_RING", "64"}};
  auto r = ParseConfig(&FakeEnv, envp.data());
  REQUIRE(r.errors.size() == 4);
  CHECK(r.errors[0] == "unknown variable NCCLWATCH_TIMOUT, did you mean NCCLWATCH_TIMEOUT?");
  CHECK(r.errors[1] == "unknown variable NCCLWATCH_STAKCS, did you mean NCCLWATCH_STACKS?");
  CHECK(r.errors[2] == "unknown variable NCCLWATCH_WHATEVER_ELSE (the settings: README, Configuration)");
  CHECK(r.errors[3].find("NCCLWATCH_EVIL\\x1b[2J") != std::string::npos);
  CHECK(ParseConfig(&FakeEnv).errors.empty());  // no environment given: nothing scanned
}

TEST_CASE("a value's newline, escape or length never breaks its one line") {
  auto r = Parse({{"NCCLWATCH_RING", "12\nncclwatch: fake line\x1b[2J"}});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].find('\n') == std::string::npos);
  CHECK(r.errors[0].find('\x1b') == std::string::npos);
  CHECK(r.errors[0].find("12\\x0ancclwatch: fake line\\x1b[2J") != std::string::npos);
  r = Parse({{"NCCLWATCH_LOG", std::string(100000, 'v')}});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].size() < 400);
  CHECK(r.errors[0].find("expected quiet, warn, info or debug") != std::string::npos);  // the reason survives
}

TEST_CASE("numbers are decimal for every kind of setting") {
  for (const char* v : {"0x10", "inf", "nan", "0x1p4"}) {
    INFO(v);
    CHECK(Parse({{"NCCLWATCH_ADAPTIVE_FLOOR", v}}).errors.size() == 1);
    CHECK(Parse({{"NCCLWATCH_TIMEOUT", v}}).errors.size() == 1);
    CHECK(Parse({{"NCCLWATCH_ADAPTIVE", v}}).errors.size() == 1);
    CHECK(Parse({{"NCCLWATCH_RING", v}}).errors.size() == 1);
  }
  CHECK(Parse({{"NCCLWATCH_TIMEOUT", "16"}}).config.timeout.default_s == 16.0);
  CHECK(Parse({{"NCCLWATCH_ADAPTIVE_FLOOR", "2.5"}}).config.adaptive_floor_s == 2.5);
}
