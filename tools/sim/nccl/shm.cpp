#include "shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

namespace simnccl {

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to work across processes");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word layout");

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  struct timespec ts = {timeout_ms / 1000, (timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

std::string SegmentName(const std::string& session, uint64_t key) {
  char hex[17];
  snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
  return "/ncclsim-" + session + "-" + hex;
}

namespace {

size_t RoundDown64(size_t v) { return v & ~size_t(63); }
size_t RoundUp64(size_t v) { return (v + 63) & ~size_t(63); }

// Staging sizes. Collective slots: 8 MiB per communicator in all (2 parities x nranks),
// between 4 KiB and 1 MiB per slot. Pipes: 16 MiB per communicator in all (nranks^2 pairs),
// between 4 KiB and 256 KiB each. The file is sparse: only pages touched use memory.
// NCCLWATCH_SIM_CHUNK_BYTES forces both (tests use it to exercise chunking cheaply).
void ChooseSizes(int n, uint32_t* slot, uint32_t* pipe) {
  size_t s = std::clamp<size_t>((8u << 20) / (2 * size_t(n)), 4096, 1u << 20);
  size_t p = std::clamp<size_t>((16u << 20) / (size_t(n) * n), 4096, 256u << 10);
  if (const char* e = getenv("NCCLWATCH_SIM_CHUNK_BYTES")) {
    long v = strtol(e, nullptr, 10);
    if (v >= 64 && v <= (64 << 20)) s = p = static_cast<size_t>(v);
  }
  *slot = static_cast<uint32_t>(std::max<size_t>(64, RoundDown64(s)));
  *pipe = static_cast<uint32_t>(std::max<size_t>(64, RoundDown64(p)));
}

void Layout(ShmHeader* h, int n) {
  ChooseSizes(n, &h->slot_bytes, &h->pipe_bytes);
  h->nranks = static_cast<uint32_t>(n);
  size_t off = RoundUp64(sizeof(ShmHeader));
  h->off_ranks = off;
  off += RoundUp64(sizeof(RankInfo) * n);
  h->off_slots = off;
  off += 2 * size_t(n) * (sizeof(SlotHeader) + h->slot_bytes);
  h->off_ctl = off;
  off += 2 * size_t(n) * kCtlSlotBytes;
  h->off_pipes = off;
  off += sizeof(PipeCtl) * size_t(n) * n;
  h->off_pipe_data = off;
  off += size_t(h->pipe_bytes) * n * n;
  h->total_bytes = (off + 4095) & ~size_t(4095);
}

void SleepMs(int ms) {
  struct timespec ts = {0, ms * 1000000L};
  nanosleep(&ts, nullptr);
}

}  // namespace

bool MapSegment(const std::string& name, int nranks, const std::atomic<bool>& stop, Segment* seg,
                std::string* err) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd >= 0) {
    // Creator: size, map, lay out, then publish with the magic word.
    ShmHeader probe{};
    Layout(&probe, nranks);
    if (ftruncate(fd, static_cast<off_t>(probe.total_bytes)) != 0) {
      *err = std::string("ftruncate: ") + strerror(errno);
      close(fd);
      shm_unlink(name.c_str());
      return false;
    }
    void* p = mmap(nullptr, probe.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
      *err = std::string("mmap: ") + strerror(errno);
      shm_unlink(name.c_str());
      return false;
    }
    // The file is zero-filled: every atomic starts at 0. Only the constants need writing.
    auto* h = static_cast<ShmHeader*>(p);
    h->nranks = probe.nranks;
    h->slot_bytes = probe.slot_bytes;
    h->pipe_bytes = probe.pipe_bytes;
    h->total_bytes = probe.total_bytes;
    h->off_ranks = probe.off_ranks;
    h->off_slots = probe.off_slots;
    h->off_ctl = probe.off_ctl;
    h->off_pipes = probe.off_pipes;
    h->off_pipe_data = probe.off_pipe_data;
    h->magic.store(kShmMagic, std::memory_order_release);
    seg->hdr = h;
    seg->bytes = probe.total_bytes;
    return true;
  }
  if (errno != EEXIST) {
    *err = "shm_open " + name + ": " + strerror(errno);
    return false;
  }
  fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    *err = "shm_open " + name + ": " + strerror(errno);
    return false;
  }
  // Another rank created it: wait (briefly) for its ftruncate and its layout.
  struct stat st {};
  while (fstat(fd, &st) == 0 && st.st_size == 0) {
    if (stop.load()) {
      close(fd);
      *err = "aborted";
      return false;
    }
    SleepMs(1);
  }
  void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    *err = std::string("mmap: ") + strerror(errno);
    return false;
  }
  auto* h = static_cast<ShmHeader*>(p);
  while (h->magic.load(std::memory_order_acquire) != kShmMagic) {
    if (stop.load()) {
      munmap(p, static_cast<size_t>(st.st_size));
      *err = "aborted";
      return false;
    }
    SleepMs(1);
  }
  seg->hdr = h;
  seg->bytes = static_cast<size_t>(st.st_size);
  if (static_cast<int>(h->nranks) != nranks) {
    *err = "ranks disagree on the communicator size (" + std::to_string(h->nranks) + " vs " +
           std::to_string(nranks) + ")";
    UnmapSegment(seg);
    return false;
  }
  return true;
}

void UnmapSegment(Segment* seg) {
  if (seg->hdr) munmap(seg->hdr, seg->bytes);
  seg->hdr = nullptr;
  seg->bytes = 0;
}

bool BarrierWait(ShmBarrier& b, uint32_t nranks, uint64_t* round, const std::atomic<bool>& stop) {
  const uint64_t k = (*round)++;
  const uint32_t want = static_cast<uint32_t>(k + 1);
  if (b.arrivals.fetch_add(1, std::memory_order_acq_rel) + 1 == (k + 1) * nranks) {
    b.released.store(want, std::memory_order_release);
    FutexWakeAll(&b.released);
    return true;
  }
  for (;;) {
    uint32_t cur = b.released.load(std::memory_order_acquire);
    if (static_cast<int32_t>(cur - want) >= 0) return true;
    if (stop.load(std::memory_order_relaxed)) return false;
    // Timed so a stop request is seen even without a wake (ncclCommAbort also wakes).
    FutexWait(&b.released, cur, 200);
  }
}

}  // namespace simnccl
