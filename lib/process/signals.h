// The process's signal handling: dumps on signals, then behaves exactly as if ncclwatch were
// not there: the handler that was installed before runs (or the default action, so the exit
// status is unchanged). Above dump/ (a signal that ends the process abandons the dump being
// written), below runtime/; what our handler leaves on a stack, which dumps cut off, is in
// common/signal_frames.h.
//
// Handlers only do async-signal-safe things: they post a request and wake the watchdog thread,
// which writes the dump, and wait for it at most NCCLWATCH_SIGNAL_WAIT_MS.
#pragma once

#include <cstdint>
#include <cstddef>

#include "ncclwatch/trace_format.h"

namespace ncclwatch {

struct SignalHooks {
  void (*wake)(void* arg) = nullptr;  // must be async-signal-safe
  void* arg = nullptr;
  // Called right before a signal's default action ends the process (async-signal-safe): the
  // process's node-local files go with it.
  void (*ending)(void* arg) = nullptr;
  void* ending_arg = nullptr;
};

// Installs handlers for SIGTERM, SIGINT and the fatal signals (if `terminate_and_fatal`), and
// the on-demand dump signal (if not 0 and not already handled by the application).
void InstallSignalHandlers(bool terminate_and_fatal, int dump_signal, uint64_t wait_ms, SignalHooks hooks);
// Set once the watchdog thread exists: a fatal signal on that thread does not wait for itself.
void SetWatchdogTid(int tid);

// Watchdog side: the signal waiting for a dump, if any (0 none); then DoneSignalDump().
int TakePendingSignal(trace::DumpReason* reason);
// The thread whose system call (nanosleep, poll, ...) the on-demand dump signal cut short since
// the last call (0: none); the kernel gives a signal sent to the process to any thread.
int TakeDumpSignalCut();
// The fatal signal whose handler, set by the application, gave it back its default action (the
// process ends with it once its dump is written); 0: none.
int TakeGivenBack();
void DoneSignalDump();

// For tests: restores the handlers that were installed before.
void UninstallSignalHandlers();

}  // namespace ncclwatch
