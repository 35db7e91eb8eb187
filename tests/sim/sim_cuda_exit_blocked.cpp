// Returns from main while stream workers are blocked forever in host functions, as in a
// simulated hang: the simulated driver must let the process exit anyway.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "ncclwatch/cuda_abi.h"

namespace {

std::mutex startedMutex;
std::condition_variable startedCv;
int started = 0;

// Sleeps rather than waits on a condition variable: glibc's exit-time destruction of a
// condition variable that still has waiters would itself block.
void blockForever(void*) {
  {
    std::lock_guard<std::mutex> lk(startedMutex);
    ++started;
    startedCv.notify_all();
  }
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

void unreachable(void*) { std::fprintf(stderr, "work behind a blocked item ran\n"); }

}  // namespace

int main() {
  CUstream stream;
  if (cuInit(0) != CUDA_SUCCESS || cuStreamCreate(&stream, 0) != CUDA_SUCCESS) return 1;
  if (cuLaunchHostFunc(stream, blockForever, nullptr) != CUDA_SUCCESS) return 1;
  if (cuLaunchHostFunc(stream, unreachable, nullptr) != CUDA_SUCCESS) return 1;
  if (cuLaunchHostFunc(CU_STREAM_PER_THREAD, blockForever, nullptr) != CUDA_SUCCESS) return 1;
  // Both workers must be inside their host function, not merely have it queued.
  std::unique_lock<std::mutex> lk(startedMutex);
  startedCv.wait(lk, [] { return started == 2; });
  std::puts("returning from main with blocked streams");
  return 0;
}
