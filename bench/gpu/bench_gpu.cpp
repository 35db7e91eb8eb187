// What ncclwatch costs per NCCL call on a real GPU, and what the driver calls it is made of.
// Built only where a CUDA toolkit (cuda.h, libcuda) and nccl.h are found; run it through
// bench/gpu_bench.sh, which alternates processes with and without the library.
//
//   bench_gpu allreduce [BURSTS]   ncclAllReduce in place, 1 rank, 1 float: bursts of 256 calls
//                                  alternating between NCCL's own ncclAllReduce (from NCCL's
//                                  handle: the bare call, even with libncclwatch.so preloaded)
//                                  and the one the process resolves (the library's, when
//                                  preloaded); the stream is drained between bursts, outside
//                                  the timing. One JSON line: median ns per call of each.
//   bench_gpu driver [BURSTS]      the driver calls the markers are made of, alone: one JSON line
//                                  of median ns per call each.
// NCCL is opened at run time (NCCL_LIB, default libnccl.so.2: PyTorch's wheel keeps it under
// site-packages/nvidia/nccl/lib), so that the bare function can be had beside the preloaded
// one. Exit status 77: no CUDA device or no NCCL (skipped, not failed).
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kBurst = 256;
constexpr int kSkipped = 77;

uint64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

[[noreturn]] void Die(const char* what, int code) {
  std::fprintf(stderr, "bench_gpu: %s\n", what);
  std::exit(code);
}

void Check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::fprintf(stderr, "bench_gpu: %s failed: %s\n", what, name ? name : "?");
  std::exit(1);
}

struct Gpu {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  char name[256] = {};
  int driver = 0;
};

Gpu OpenGpu() {
  Gpu g;
  int count = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0)
    Die("no CUDA device: skipped", kSkipped);
  Check(cuDeviceGet(&g.dev, 0), "cuDeviceGet");
  Check(cuDevicePrimaryCtxRetain(&g.ctx, g.dev), "cuDevicePrimaryCtxRetain");
  Check(cuCtxSetCurrent(g.ctx), "cuCtxSetCurrent");
  Check(cuStreamCreate(&g.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  cuDeviceGetName(g.name, sizeof g.name - 1, g.dev);
  cuDriverGetVersion(&g.driver);
  return g;
}

// Median ns per call of `call` over `bursts` bursts of kBurst calls; `between` runs between
// bursts, outside the timing (draining the stream).
template <typename F, typename B>
double PerCall(int bursts, F&& call, B&& between) {
  std::vector<double> per;
  for (int b = 0; b < bursts + 2; ++b) {  // the first two warm up
    const uint64_t t0 = NowNs();
    for (int i = 0; i < kBurst; ++i) call(i);
    const uint64_t t1 = NowNs();
    between();
    if (b >= 2) per.push_back(static_cast<double>(t1 - t0) / kBurst);
  }
  return Median(per);
}

using AllReduceFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                     cudaStream_t);

int AllReduce(int bursts) {
  const char* lib = std::getenv("NCCL_LIB");
  void* h = dlopen(lib && *lib ? lib : "libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!h) Die((std::string("cannot open NCCL (set NCCL_LIB): ") + dlerror() + ": skipped").c_str(), kSkipped);
  Gpu g = OpenGpu();
  auto get_id = reinterpret_cast<ncclResult_t (*)(ncclUniqueId*)>(dlsym(RTLD_DEFAULT, "ncclGetUniqueId"));
  auto init = reinterpret_cast<ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int)>(
      dlsym(RTLD_DEFAULT, "ncclCommInitRank"));
  auto version = reinterpret_cast<ncclResult_t (*)(int*)>(dlsym(RTLD_DEFAULT, "ncclGetVersion"));
  auto bare = reinterpret_cast<AllReduceFn>(dlsym(h, "ncclAllReduce"));
  auto resolved = reinterpret_cast<AllReduceFn>(dlsym(RTLD_DEFAULT, "ncclAllReduce"));
  if (!get_id || !init || !version || !bare || !resolved) Die("NCCL lacks a function: skipped", kSkipped);
  ncclUniqueId id;
  ncclComm_t comm;
  int nccl_version = 0;
  version(&nccl_version);
  if (get_id(&id) != ncclSuccess || init(&comm, 1, id, 0) != ncclSuccess) Die("ncclCommInitRank failed", 1);
  CUdeviceptr buf;
  Check(cuMemAlloc(&buf, sizeof(float)), "cuMemAlloc");
  auto* p = reinterpret_cast<void*>(buf);
  auto* s = reinterpret_cast<cudaStream_t>(g.stream);
  auto drain = [&] { Check(cuStreamSynchronize(g.stream), "cuStreamSynchronize"); };
  // Bursts alternate between the two, each pair in the other order than the one before.
  std::vector<double> direct, wrapped;
  for (int b = 0; b < bursts; ++b) {
    for (int k = 0; k < 2; ++k) {
      const bool use_bare = (b + k) % 2 == 0;
      const AllReduceFn f = use_bare ? bare : resolved;
      (use_bare ? direct : wrapped)
          .push_back(PerCall(1, [&](int) { f(p, p, 1, ncclFloat, ncclSum, comm, s); }, drain));
    }
  }
  std::printf("{\"mode\":\"allreduce\",\"gpu\":\"%s\",\"driver\":%d,\"nccl\":%d,\"preloaded\":%s,"
              "\"bursts\":%d,\"direct_ns\":%.1f,\"wrapped_ns\":%.1f}\n",
              g.name, g.driver, nccl_version, bare == resolved ? "false" : "true", bursts, Median(direct),
              Median(wrapped));
  return 0;
}

void NoOp(void*) {}

int Driver(int bursts) {
  Gpu g = OpenGpu();
  auto drain = [&] { Check(cuStreamSynchronize(g.stream), "cuStreamSynchronize"); };
  CUevent plain[2], timed;
  for (CUevent& e : plain) Check(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  Check(cuEventCreate(&timed, CU_EVENT_DEFAULT), "cuEventCreate");
  std::vector<std::pair<const char*, double>> out;
  out.emplace_back("cuEventRecord_disable_timing", PerCall(bursts, [&](int) { cuEventRecord(plain[0], g.stream); }, drain));
  out.emplace_back("cuEventRecord_two_in_a_row", PerCall(bursts, [&](int) {
                     cuEventRecord(plain[0], g.stream);
                     cuEventRecord(plain[1], g.stream);
                   }, drain));
  out.emplace_back("cuEventRecord_timing", PerCall(bursts, [&](int) { cuEventRecord(timed, g.stream); }, drain));
  CUstreamCaptureStatus status;
  out.emplace_back("cuStreamIsCapturing", PerCall(bursts, [&](int) { cuStreamIsCapturing(g.stream, &status); }, drain));
#if CUDA_VERSION >= 13000
  cuuint64_t capture_id;
  out.emplace_back("cuStreamGetCaptureInfo", PerCall(bursts, [&](int) {
                     cuStreamGetCaptureInfo(g.stream, &status, &capture_id, nullptr, nullptr, nullptr, nullptr);
                   }, drain));
#endif
  CUcontext ctx;
  out.emplace_back("cuCtxGetCurrent", PerCall(bursts, [&](int) { cuCtxGetCurrent(&ctx); }, drain));
  out.emplace_back("cuStreamGetCtx", PerCall(bursts, [&](int) { cuStreamGetCtx(g.stream, &ctx); }, drain));
  cuEventRecord(plain[0], g.stream);
  drain();
  out.emplace_back("cuEventQuery_completed", PerCall(bursts, [&](int) { cuEventQuery(plain[0]); }, drain));
  // A stream memory write to host-mapped memory: an alternative marker, where supported.
  void* host = nullptr;
  CUdeviceptr mapped = 0;
  if (cuMemHostAlloc(&host, 64, CU_MEMHOSTALLOC_DEVICEMAP) == CUDA_SUCCESS &&
      cuMemHostGetDevicePointer(&mapped, host, 0) == CUDA_SUCCESS &&
      cuStreamWriteValue32(g.stream, mapped, 1, 0) == CUDA_SUCCESS) {
    drain();
    out.emplace_back("cuStreamWriteValue32_host_mapped",
                     PerCall(bursts, [&](int i) { cuStreamWriteValue32(g.stream, mapped, i, 0); }, drain));
  } else {
    out.emplace_back("cuStreamWriteValue32_host_mapped", -1);  // unsupported here
  }
  out.emplace_back("cuLaunchHostFunc", PerCall(bursts, [&](int) { cuLaunchHostFunc(g.stream, &NoOp, nullptr); }, drain));
  std::printf("{\"mode\":\"driver\",\"gpu\":\"%s\",\"driver\":%d,\"bursts\":%d", g.name, g.driver, bursts);
  for (auto& [name, ns] : out) std::printf(",\"%s\":%.1f", name, ns);
  std::printf("}\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  const int bursts = argc > 2 ? std::max(1, std::atoi(argv[2])) : 41;
  if (std::strcmp(mode, "allreduce") == 0) return AllReduce(bursts);
  if (std::strcmp(mode, "driver") == 0) return Driver(bursts);
  std::fprintf(stderr, "usage: bench_gpu allreduce|driver [BURSTS]\n");
  return 2;
}
