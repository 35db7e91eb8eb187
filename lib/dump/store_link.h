// One host's link to the launcher's store (common/tcp_store.h), for a dump directory that is
// not shared across hosts (Kubernetes pods, node-local disks): the job-wide request and every
// rank's dump travel through the store instead (keys: dump/store_evidence.h).
//
// Only the process the relay elects on each host (request_relay.h) runs a link: one connection
// per host, on its own thread, never the application's nor the watchdog's. The thread:
//   - (NCCLWATCH_STORE=auto) leaves a marker file in the dump directory and, after
//     kStoreDetect, goes on only when no other host's marker is there (a shared directory needs
//     no store) and the world spans several hosts;
//   - connects (bounded), registers the host, then holds one blocking WAIT for the next request
//     key with a bounded timeout (no polling of the store): a request that arrives is written in
//     the host's dump directory, as a shared directory would hold it (the watcher relays it to
//     the host's ranks, and a rank that stalls sees the episode already asked for);
//   - publishes the host's own requests (Publish, from the watchdog's tick, wakes the WAIT);
//   - for kStoreScanWindow after each request, looks at the dump directory every second and
//     publishes the host's new dumps (compressed; one over NCCLWATCH_STORE_MAX_KB is left out with
//     one line), and unpublishes those its processes removed: the store holds at most what the
//     directory does;
//   - at a normal end (Stop(clean)), removes the host's keys, and the job's when it is the last
//     host linked.
// An unreachable, slow or vanished store costs one line; the host then works as without it.
#pragma once

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "format/request.h"

namespace ncclwatch {
namespace store {
class Client;
}

struct StoreSettings {
  std::string mode = "off";  // NCCLWATCH_STORE: auto, on, off
  std::string address;       // HOST:PORT ("" unknown: no link)
  std::string prefix;        // store::JobPrefix of this job and attempt
  std::string host;          // this host, as its dump files name it (SafeHostName)
  std::string instance;      // this process's job instance (a request from the store gets it)
  uint64_t max_dump_bytes = 1u << 20;
  bool multi_host = false;   // the world spans several hosts (auto needs it)
  // Test seams: the detection wait (kStoreDetect) and the WAIT's bound (kStoreWait), ms; 0: defaults.
  int detect_ms = 0;
  int wait_ms = 0;
};

// Reads NCCLWATCH_STORE and the launcher's variables: the settings for this process.
// `mode`/`address`/`max_kb`: the NCCLWATCH_ settings; `host`: this host's name.
StoreSettings ReadStoreSettings(const std::string& mode, const std::string& address, uint64_t max_kb,
                                const std::string& host);

class StoreLink {
 public:
  // `dump_dir`: this host's dump directory.
  StoreLink(StoreSettings s, std::string dump_dir);
  ~StoreLink();
  StoreLink(const StoreLink&) = delete;
  StoreLink& operator=(const StoreLink&) = delete;

  bool Start();
  // A request of this host (read in its dump directory) for the other hosts; one that came
  // through the store is not sent back. Never blocks.
  void Publish(const trace::DumpRequest& r);
  // Ends the link within `wait_ms`; `clean`: the host's keys are removed first. True when the
  // thread ended in time (else it is left to end with the process, and this object with it).
  bool Stop(bool clean, int wait_ms);

  // For tests and the debug line: whether the link is connected now, and what it did.
  bool linked() const { return linked_.load(); }
  uint64_t published_dumps() const { return published_dumps_.load(); }
  uint64_t requests() const { return requests_.load(); }
  uint64_t requests_in() const { return requests_in_.load(); }

 private:
  static void* Main(void* self);
  void Run();
  bool Detect();  // auto: false when the link is not needed
  void ScanAndPublish(store::Client* c);
  void Clean(store::Client* c);
  bool Woken(int ms);  // waits `ms` on the wake descriptor; true when stopped meanwhile

  StoreSettings s_;
  std::string dump_dir_, marker_;
  int wake_fd_ = -1;
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool stop_ = false, clean_ = false, done_ = false, started_ = false;  // under mu_
  std::vector<std::string> outbox_;                                   // under mu_
  std::set<std::string> known_;  // under mu_: request ids published or received
  std::atomic<bool> linked_{false};
  std::atomic<uint64_t> published_dumps_{0}, requests_{0}, requests_in_{0};
  // The thread's own state.
  struct Published {
    int64_t size = -1, mtime_ns = -1;
    bool in_store = false;
  };
  std::map<std::string, Published> published_;
  int64_t host_slot_ = -1;
  int64_t next_request_ = 1;
  uint64_t published_bytes_ = 0;
  bool bound_said_ = false;
};

}  // namespace ncclwatch
