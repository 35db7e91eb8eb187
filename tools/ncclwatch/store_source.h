// The launcher's store as a source of evidence for the commands (`run`, `dump`, `analyze`
// --store HOST:PORT): the dumps that hosts without a shared directory published there
// (lib/dump/store_evidence.h) are fetched into the local dump directory, and the report says
// which hosts' evidence it holds.
#pragma once

#include <string>
#include <vector>

#include "command_line.h"
#include "common/tcp_store.h"
#include "dump/store_evidence.h"

namespace ncclwatch {
namespace cli {

struct StoreSource {
  std::string address;  // HOST:PORT; "" none
  std::string job;      // the run id (torchrun's --rdzv-id); "" TORCHELASTIC_RUN_ID, else "none"
  bool given() const { return !address.empty(); }
  std::string Job() const;
};

// The options --store HOST:PORT and --store-job ID, for a subcommand's table.
std::vector<Option> StoreOptions(StoreSource* s);

// Connects and finds the job's latest attempt in the store. False: one line said why (`sub`:
// the subcommand's name; `quiet`: nothing said).
bool OpenStore(const char* sub, const StoreSource& s, store::Client* c, std::string* prefix, bool quiet = false);

// Fetches the published dumps of every host but `skip_host` into `dir` (made if missing).
// `say`: one line on stderr naming the hosts whose evidence is there and how many dumps each,
// and one per dump that could not be read back. False: the store could not be read (said).
bool GatherFromStore(const char* sub, const StoreSource& s, const std::string& dir, const std::string& skip_host,
                     bool say, std::vector<store::HostEvidence>* hosts = nullptr);

// "host a (4 dumps), host b (4 dumps)".
std::string DescribeHosts(const std::vector<store::HostEvidence>& hosts);

}  // namespace cli
}  // namespace ncclwatch
