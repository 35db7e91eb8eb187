#include "store_source.h"

#include <cstdio>
#include <cstdlib>

#include "dump/dump_files.h"
#include "format/display.h"

namespace ncclwatch {
namespace cli {

namespace {
constexpr int kConnectMs = 5000;
constexpr int kMaxRestarts = 100;  // attempts looked for (torchrun's --max-restarts is far lower)
}  // namespace

std::string StoreSource::Job() const {
  if (!job.empty()) return job;
  const char* env = getenv("TORCHELASTIC_RUN_ID");
  return env && *env ? env : "none";
}

std::vector<Option> StoreOptions(StoreSource* s) {
  return {{"--store", nullptr, "HOST:PORT",
           [s](const char* v) {
             std::string host;
             int port = 0;
             if (!store::ParseAddress(v, &host, &port)) return std::string("--store takes HOST:PORT (the launcher's store, e.g. MASTER_ADDR:MASTER_PORT)");
             s->address = v;
             return std::string();
           }},
          {"--store-job", nullptr, "the run id",
           [s](const char* v) {
             if (!*v || std::string(v).find('/') != std::string::npos) return std::string("--store-job takes the run id (torchrun's --rdzv-id), without '/'");
             s->job = v;
             return std::string();
           }}};
}

bool OpenStore(const char* sub, const StoreSource& s, store::Client* c, std::string* prefix, bool quiet) {
  std::string host, why;
  int port = 0;
  store::ParseAddress(s.address, &host, &port);
  if (!c->Connect(host, port, kConnectMs, &why)) {
    if (!quiet) std::fprintf(stderr, "ncclwatch %s: cannot reach the store at %s: %s\n", sub, s.address.c_str(), why.c_str());
    return false;
  }
  // The latest attempt: attempts follow each other, so the first missing one ends the look.
  std::string found;
  for (int k = 0; k <= kMaxRestarts; ++k) {
    const std::string p = store::JobPrefix(s.Job(), std::to_string(k));
    bool exists = false;
    if (!c->Check(p + "hosts", &exists, kConnectMs)) {
      if (!quiet) std::fprintf(stderr, "ncclwatch %s: the store at %s: %s\n", sub, s.address.c_str(), c->error().c_str());
      return false;
    }
    if (!exists) break;
    found = p;
  }
  if (found.empty()) {
    c->Close();  // nothing of the job yet: the next look connects again
    if (!quiet)
      std::fprintf(stderr, "ncclwatch %s: the store at %s holds nothing of job '%s' (--store-job: torchrun's --rdzv-id)\n",
                   sub, s.address.c_str(), trace::PrintableCut(s.Job()).c_str());
    return false;
  }
  *prefix = found;
  return true;
}

std::string DescribeHosts(const std::vector<store::HostEvidence>& hosts) {
  std::string out;
  for (const auto& h : hosts)
    out += (out.empty() ? "" : ", ") + std::string("host ") + trace::PrintableCut(h.host) + " (" +
           std::to_string(h.files.size()) + (h.files.size() == 1 ? " dump)" : " dumps)");
  return out.empty() ? "no host" : out;
}

bool GatherFromStore(const char* sub, const StoreSource& s, const std::string& dir, const std::string& skip_host,
                     bool say, std::vector<store::HostEvidence>* hosts_out) {
  store::Client c;
  std::string prefix, why;
  if (!OpenStore(sub, s, &c, &prefix, !say)) return false;
  if (!MakeDirs(dir, &why)) {
    if (say) std::fprintf(stderr, "ncclwatch %s: cannot create %s: %s\n", sub, dir.c_str(), why.c_str());
    return false;
  }
  std::vector<store::HostEvidence> hosts;
  const bool ok = store::FetchEvidence(&c, prefix, dir, skip_host, &hosts, &why);
  if (say) {
    for (const auto& h : hosts)
      for (const auto& p : h.problems) std::fprintf(stderr, "ncclwatch %s: from the store: %s\n", sub, p.c_str());
    if (!ok) std::fprintf(stderr, "ncclwatch %s: reading the store at %s: %s\n", sub, s.address.c_str(), why.c_str());
    std::fprintf(stderr, "ncclwatch %s: evidence from the store at %s (%s): %s\n", sub, s.address.c_str(),
                 prefix.c_str(), DescribeHosts(hosts).c_str());
  }
  if (hosts_out) *hosts_out = std::move(hosts);
  return ok;
}

}  // namespace cli
}  // namespace ncclwatch
