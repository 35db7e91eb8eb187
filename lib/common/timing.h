// The time windows and waits that decide ncclwatch's behaviour, in one place, each with why.
// Users feel them at scale (README "Timing"); the user-set ones are NCCLWATCH_* settings
// (config.h). std::chrono types, so that no constant carries its unit in a comment only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace ncclwatch {
namespace timing {

using namespace std::chrono_literals;
using Duration = std::chrono::milliseconds;

// A job-wide request of this job, this recent, asked for a stall or an abort after the stalling
// rank's operation got stuck, answers that stall too: with thousands of ranks stalling at once,
// the request file is written a few times, not thousands. Any other request (a snapshot, one
// from before the operation got stuck, or before a recovery of this rank) is followed by a new
// one: every rank answers a hang with a dump taken during it.
constexpr Duration kRequestFresh = 30s;
// Frameworks abort every communicator in a row before killing the process: aborts this close
// together share one dump.
// Ended communicators (destroyed, finalized, aborted) past the newest kEndedCommsKept are
// forgotten this long after they ended, checked this often: elastic jobs create thousands.
constexpr Duration kEndedCommForget = 60s;
constexpr Duration kEndedCommCheck = 10s;
constexpr size_t kEndedCommsKept = 64;
constexpr Duration kAbortBurst = 30s;
// A dump waits this long for another one in progress (a signal dump behind a stall dump); past
// it, the later dump is dropped rather than wait forever.
constexpr Duration kDumpLockWait = 30s;
// Each thread gets this long to record its own stack when signalled at dump time.
constexpr Duration kThreadStackWait = 300ms;
// How long a dump waits for the watchdog's state (the in-flight list), and the recovery list.
constexpr Duration kInflightLockWait = 1000ms;
constexpr Duration kRecoveriesLockWait = 500ms;
// At a normal exit, operations still finishing are given kExitSettleChecks looks this far apart
// (a script that ends without a final synchronize is not "in flight at exit").
constexpr int kExitSettleChecks = 5;
constexpr Duration kExitSettleInterval = 50ms;
constexpr Duration kExitInflightLockWait = 200ms;
// How long exit waits for the watchdog thread to stop.
constexpr Duration kWatchdogStopWait = 1000ms;
// NCCLWATCH_METRICS: how often each process rewrites its Prometheus file (node-exporter reads
// it on its own schedule; a few seconds keeps the file fresh without file-system load).
constexpr Duration kMetricsInterval = 5s;
// A stream with nothing in flight for this long is forgotten by the watchdog (its state freed).
constexpr Duration kIdleStreamForget = 600s;

constexpr uint64_t Ns(Duration d) { return static_cast<uint64_t>(std::chrono::nanoseconds(d).count()); }
constexpr int Ms(Duration d) { return static_cast<int>(d.count()); }
constexpr double S(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace timing
}  // namespace ncclwatch
