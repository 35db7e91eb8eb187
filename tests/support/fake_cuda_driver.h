// A CUDA driver in memory for the unit tests: events are numbers, and an event recorded on a
// stream is reached only when the test says so. Its entry points are plain functions, so there
// is one fake GPU per process: Reset() it at the start of each test. Thread-safe (the
// watchdog's thread queries events while the test records them).
#pragma once

#include "gpu/driver.h"

namespace ncclwatch {
namespace testing {

class FakeCuda {
 public:
  static CudaDriver Driver();  // every entry point the library calls
  static void Reset();         // no events, nothing failing, not capturing

  static void Reach(CUevent e);                                // the GPU got past e
  static void FailNextCreates(int n);                          // the next n cuEventCreate fail
  static void SetCapture(CUstreamCaptureStatus status);        // what cuStreamIsCapturing says
  static int Created();                                        // cuEventCreate calls that succeeded
  static CUstreamCaptureMode LastCaptureMode();                // set by cuThreadExchangeStreamCaptureMode
};

}  // namespace testing
}  // namespace ncclwatch
