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
// The launcher's store (dump/store_link.h), used by one process per host. NCCLWATCH_STORE=auto
// looks for other hosts' marks in the dump directory this long after leaving its own (hosts
// start within seconds of each other: the rendezvous). Connecting, and each query, is bounded
// by its wait; the one blocking WAIT for the next request is renewed this often (its
// cancellation and renewal: two small queries a host, the idle load). After each request the
// host's dump directory is looked at every kStoreScanInterval for kStoreScanWindow, and at most
// kStorePublishPerScan dumps are published a look; a dump's text is read up to kStoreMaxDumpText,
// and a host publishes kStoreMaxHostBytes at most (compressed).
constexpr Duration kStoreDetect = 10s;
constexpr Duration kStoreConnectWait = 5s;
constexpr Duration kStoreOpWait = 5s;
constexpr Duration kStoreWait = 30s;
// At a normal exit the host's keys are removed within this, or left (the store ends with the job).
constexpr Duration kStoreLeaveWait = 2s;
constexpr Duration kStoreScanWindow = 120s;
constexpr Duration kStoreScanInterval = 1s;
constexpr int kStorePublishPerScan = 16;
constexpr size_t kStoreMaxDumpText = size_t{64} << 20;
constexpr size_t kStoreMaxHostBytes = size_t{64} << 20;
// Ended communicators (destroyed, finalized, aborted) past the newest kEndedCommsKept are
// forgotten this long after they ended, checked this often: elastic jobs create thousands.
constexpr Duration kEndedCommForget = 60s;
constexpr Duration kEndedCommCheck = 10s;
constexpr size_t kEndedCommsKept = 64;
// Frameworks abort every communicator in a row before killing the process: aborts this close
// together share one dump.
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
// A process ending without exit handlers (_exit, quick_exit) hands its exit record to the
// watchdog thread; the exiting thread checks this often whether it is written (sleeping between
// checks, async-signal-safe), for at most the signal wait setting.
constexpr Duration kQuickExitCheck = 2ms;

// The watchdog thread's periodic checks. Loaded libraries (dlopen, dlclose) are looked at this
// often for the black box: the watchdog ticks every 0.1 ms at high rates.
constexpr Duration kModulesCheck = 1s;
// Python's exit is watched from the first NCCL call; when the GIL was busy then, the watchdog
// thread tries again this often until the GIL is had.
constexpr Duration kPythonExitRetry = 1s;
// The GIL waits of work that must not hold a process up: naming the Python frames of new call
// sites for the black box (retried at the next polls), the exit record of _exit (the exiting
// thread may hold the GIL itself) and the Python exit watch.
constexpr Duration kBackgroundGilWait = 100ms;

// Stacks. A GIL request waits at least this long even when the GIL has been unavailable for its
// whole timeout: enough for a GIL that was just freed to reach the helper (CPython hands the GIL
// over within its 5 ms switch interval).
constexpr Duration kMinGilWait = 50ms;
// A thread seen running when stacks are captured is looked at again every kRunningLook for up
// to kRunningPatience: one that waits in a system call at a look is unwound there without a
// signal (a signal landing as it enters nanosleep or poll would cut that wait short). Only a
// thread seen running at every look is signalled.
constexpr Duration kRunningPatience = 20ms;
constexpr std::chrono::microseconds kRunningLook = 100us;
// How long a thread's stack signal handler that has started capturing gets to finish after the
// deadline.
constexpr Duration kCapturingGrace = 20ms;
// Reading another thread's frames goes through process_vm_readv, a system call per field (about
// 100 us for 8 frames): each native thread reuses what it read for this long, so that a burst
// of calls (DDP's bucket all-reduces during one backward()) pays it once. The driving thread's
// line may then be up to that old.
constexpr Duration kDriverFramesReuse = 200ms;

// The host's caretaker (post-mortems of dead processes). A dead process's dump of its own end
// (fatal signal, SIGTERM) this close to its last sign of life is its last word: nothing to add.
constexpr Duration kFinalDumpMargin = 3s;
// Hidden black boxes and unwatched relay files younger than this may belong to a process that
// is starting: left alone.
constexpr Duration kLeftoverMinAge = 5s;
// A live process whose watchdog has not polled for this long is looked at in /proc: stopped?
constexpr Duration kStoppedLookAfter = 1s;

constexpr uint64_t Ns(Duration d) { return static_cast<uint64_t>(std::chrono::nanoseconds(d).count()); }
constexpr int Ms(Duration d) { return static_cast<int>(d.count()); }
constexpr double S(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace timing
}  // namespace ncclwatch
