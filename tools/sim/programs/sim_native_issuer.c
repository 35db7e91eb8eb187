/* A C helper for Python test jobs (ctypes): issues one all-reduce from a native thread of its own
 * while the calling thread waits for it, as PyTorch's autograd thread issues DDP's all-reduces
 * while the main thread waits in loss.backward(). NCCL and CUDA are looked up in the process
 * (dlsym), so a preloaded ncclwatch sees the call. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

struct Work {
  void *comm, *buf, *stream;
  size_t count;
  int result;
};

static void* Issue(void* arg) {
  struct Work* w = (struct Work*)arg;
  int (*all_reduce)(const void*, void*, size_t, int, int, void*, void*) =
      (int (*)(const void*, void*, size_t, int, int, void*, void*))dlsym(RTLD_DEFAULT, "ncclAllReduce");
  int (*sync)(void*) = (int (*)(void*))dlsym(RTLD_DEFAULT, "cuStreamSynchronize");
  w->result = (all_reduce && sync) ? all_reduce(w->buf, w->buf, w->count, 7 /* float */, 0 /* sum */, w->comm,
                                                w->stream)
                                   : -1;
  if (w->result == 0) w->result = sync(w->stream);
  return NULL;
}

/* 0 when the all-reduce and the stream's synchronization succeeded. */
__attribute__((visibility("default"))) int sim_all_reduce_on_native_thread(void* comm, void* buf, size_t count, void* stream) {
  struct Work w = {comm, buf, stream, count, -1};
  pthread_t thread;
  if (pthread_create(&thread, NULL, Issue, &w) != 0) return -1;
  pthread_setname_np(thread, "native_issuer");
  pthread_join(thread, NULL);
  return w.result;
}
