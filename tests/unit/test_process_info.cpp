// Who the process is: the rules the library and the `ncclwatch` command share (the default dump
// directory of a job, the host's name), one function each.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include <unistd.h>

#include "common/process_info.h"

using namespace ncclwatch;

namespace {

// Sets a variable for one test, as it was afterwards.
struct ScopedEnv {
  std::string name, old;
  bool had;
  ScopedEnv(const char* n, const char* value) : name(n), had(std::getenv(n) != nullptr) {
    if (had) old = std::getenv(n);
    if (value) setenv(n, value, 1);
    else unsetenv(n);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

}  // namespace

TEST_CASE("the default dump directory keeps letters, digits, '-', '_' and '.' of the job's id") {
  CHECK(DefaultDumpDir("12345") == "ncclwatch-12345");
  CHECK(DefaultDumpDir("run_7.attempt-2") == "ncclwatch-run_7.attempt-2");
  CHECK(DefaultDumpDir("a/b c\n") == "ncclwatch-a_b_c_");  // never a path or a second line
  CHECK(DefaultDumpDir("") == "ncclwatch-job");
  CHECK(DefaultDumpDir("", "20260101-120000-42") == "ncclwatch-20260101-120000-42");
}

TEST_CASE("the library's default directory is the one the command predicts for the same job") {
  ScopedEnv slurm("SLURM_JOB_ID", nullptr), pmix("PMIX_NAMESPACE", nullptr), ompi("OMPI_MCA_orte_ess_jobid", nullptr);
  for (const char* id : {"elastic_run.3", "x y/z", "abc-1"}) {
    ScopedEnv torch("TORCHELASTIC_RUN_ID", id);
    CHECK(LauncherJobId() == id);
    CHECK(DefaultDumpDir(ReadProcessIdentity()) == DefaultDumpDir(LauncherJobId()));
  }
  ScopedEnv torch("TORCHELASTIC_RUN_ID", nullptr);
  CHECK(LauncherJobId().empty());
  CHECK(DefaultDumpDir(ReadProcessIdentity()) == "ncclwatch-job");
}

TEST_CASE("the host's name is NCCLWATCH_HOST, else the system's, for the library and the command alike") {
  char system[256] = {0};
  REQUIRE(gethostname(system, sizeof system - 1) == 0);
  {
    ScopedEnv host("NCCLWATCH_HOST", "simhost3");
    CHECK(HostName() == "simhost3");
    CHECK(ReadProcessIdentity().host == "simhost3");
  }
  ScopedEnv host("NCCLWATCH_HOST", nullptr);
  CHECK(HostName() == system);
  CHECK(ReadProcessIdentity().host == system);
}
