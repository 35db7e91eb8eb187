// What ncclwatch keeps in the launcher's store (common/tcp_store.h) when the dump directory is
// not shared, and how it is read back: one place for the keys, the published dumps' encoding and
// the reader that `ncclwatch run`, `dump` and `analyze` use.
//
// Every key is under the job's and attempt's prefix, `ncclwatch/<run id>/<restart count>/`
// (TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT):
//   hosts           ADD counter: how many hosts joined; host/<i> = the i-th host's name
//   live            ADD counter: hosts still linked (the last to leave deletes the rest)
//   req_seq         ADD counter of job-wide requests; req/<n> = the n-th request (format/request.h)
//   files/<host>    the names of the host's published dumps, one a line
//   dump/<host>/<name>  one dump: "NWZ1 <size>\n" + zlib data, or "NWR1 <size>\n" + the text
//                   where zlib (libz.so.1, opened at run time) is missing
// The values are small (a request, a list), but a dump, bounded by NCCLWATCH_STORE_MAX_KB.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/tcp_store.h"

namespace ncclwatch {
namespace store {

// The prefix for a run id and restart count ("" run id: "none", torchrun's default --rdzv-id).
std::string JobPrefix(const std::string& run_id, const std::string& restart_count);

// A dump's text as a published value: compressed when zlib is there. False: not encodable.
bool EncodeDump(const std::string& text, std::string* value);
// The text again; false (with *why) for a value that is not one.
bool DecodeDump(const std::string& value, std::string* text, std::string* why);

// One host's evidence as the store holds it.
struct HostEvidence {
  std::string host;
  std::vector<std::string> files;  // fetched (or, with no output directory, listed)
  std::vector<std::string> problems;  // one line each: a dump that could not be read back
};

// Reads the hosts and their published dumps under `prefix` and writes each dump as
// `out_dir/<name>` (atomically, never over an existing file: a dump already there is kept).
// `skip_host`: a host whose dumps are not fetched (the local one; "" none). False: the store
// could not be read (*why); hosts read before the failure are in *hosts.
bool FetchEvidence(Client* c, const std::string& prefix, const std::string& out_dir, const std::string& skip_host,
                   std::vector<HostEvidence>* hosts, std::string* why, int timeout_ms = 5000);

// Writes a job-wide request into the store: what `ncclwatch dump --store` does.
bool PublishRequest(Client* c, const std::string& prefix, const std::string& request_text, std::string* why,
                    int timeout_ms = 5000);

// The latest attempt of a run the store holds evidence for: the restart count whose `hosts` key
// exists, highest first among 0..max_restarts. False when none does.
bool FindLatestAttempt(Client* c, const std::string& run_id, int max_restarts, std::string* prefix, int timeout_ms = 5000);

}  // namespace store
}  // namespace ncclwatch
