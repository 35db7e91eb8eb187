// The job-wide dump request, read from the shared dump directory by one process per host and
// relayed to the host's other ranks through a node-local file: the idle load on the job's
// (shared) file system does not grow with ranks per host.
//
// The watcher is elected with flock on a node-local lock file; the kernel releases the lock when
// the watcher exits or dies, and the next rank to poll takes over. The relay holds the request's
// own text (format/request.h), so every rank applies the same rules to it as to the shared file.
// A relay directory that is missing or unusable costs one line: each rank then reads the shared
// directory itself, as without a relay; the request is never lost.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <memory>

#include "common/kept_fd.h"
#include "dump/dump_files.h"
#include "dump/store_link.h"

namespace ncclwatch {

class RequestRelay {
 public:
  // `relay_dir`: NCCLWATCH_RELAY_DIR ("none": every rank reads the shared directory); `host`:
  // this host's name (NCCLWATCH_HOST or the system's).
  RequestRelay(std::string relay_dir, std::string host);
  ~RequestRelay();
  RequestRelay(const RequestRelay&) = delete;
  RequestRelay& operator=(const RequestRelay&) = delete;

  // One peer-poll tick: the request to serve, if one arrived since the last tick.
  std::optional<trace::DumpRequest> Poll(DumpDirectory* shared, const std::string& own_instance, uint64_t own_start_unix_ns);

  // At a normal exit: hands the watch over (and the watcher removes the relay's files, and its
  // store link the host's keys).
  void Leave();

  // The launcher's store (store_link.h): this host's watcher links to it when the settings say
  // so; the link then carries the requests to and from the other hosts. Before the first Poll.
  void UseStore(StoreSettings s) { store_ = std::move(s); }
  const StoreLink* store_link() const { return link_.get(); }

  bool watcher() const { return watcher_; }
  // How many times this process looked at the shared directory's request file.
  uint64_t shared_checks() const { return shared_checks_; }
  // The node-local relay file ("" until known or when there is none).
  const std::string& relay_path() const { return relay_path_; }

 private:
  bool Open(const std::string& shared_request_path);  // false: no relay (said once)

  std::string relay_dir_;
  std::string host_;
  bool tried_ = false;
  bool usable_ = false;
  bool watcher_ = false;
  KeptFd lock_fd_;  // the watcher's flock is on it
  std::string relay_path_;
  RequestFileWatch relay_watch_;
  uint64_t shared_checks_ = 0;
  StoreSettings store_;
  std::unique_ptr<StoreLink> link_;  // the watcher's, once started
};

// The relay's file name for a shared request file and a host: the same for every rank of the
// job on that host, another for another job directory, host or user.
std::string RelayFileName(const std::string& shared_request_path, const std::string& host);

}  // namespace ncclwatch
