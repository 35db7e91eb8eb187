/* A C helper for Python test jobs (ctypes): issues one all-reduce from a native thread of its own
 * while the calling thread waits for it, as PyTorch's autograd thread issues DDP's all-reduces
 * while the main thread waits in loss.backward(). NCCL and CUDA are looked up in the process
 * (dlsym), so a preloaded ncclwatch sees the call. sim_all_reduce_on_native_thread starts a
 * thread per call; sim_all_reduce_on_worker hands the call to one long-lived worker, which waits
 * on a condition variable for its next task in between (DDP's autograd thread between steps). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <unistd.h>

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

/* The long-lived worker: one task at a time, handed over under g_mu. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_task_ready = PTHREAD_COND_INITIALIZER, g_task_done = PTHREAD_COND_INITIALIZER;
static struct Work* g_task;
static int g_task_finished, g_worker_started;

static void* Worker(void* unused) {
  (void)unused;
  pthread_mutex_lock(&g_mu);
  for (;;) {
    while (!g_task) pthread_cond_wait(&g_task_ready, &g_mu); /* idle: waiting for its next task */
    struct Work* w = g_task;
    pthread_mutex_unlock(&g_mu);
    Issue(w);
    pthread_mutex_lock(&g_mu);
    g_task = NULL;
    g_task_finished = 1;
    pthread_cond_signal(&g_task_done);
  }
  return NULL;
}

static void StartWorker(void) {
  pthread_t thread;
  if (pthread_create(&thread, NULL, Worker, NULL) != 0) return;
  pthread_setname_np(thread, "pt_autograd_0");
  pthread_detach(thread);
  g_worker_started = 1;
}

/* 0 when the worker's all-reduce and the stream's synchronization succeeded. */
__attribute__((visibility("default"))) int sim_all_reduce_on_worker(void* comm, void* buf, size_t count, void* stream) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, StartWorker);
  if (!g_worker_started) return -1;
  struct Work w = {comm, buf, stream, count, -1};
  pthread_mutex_lock(&g_mu);
  g_task = &w;
  g_task_finished = 0;
  pthread_cond_signal(&g_task_ready);
  while (!g_task_finished) pthread_cond_wait(&g_task_done, &g_mu);
  pthread_mutex_unlock(&g_mu);
  return w.result;
}

/* Called with the GIL held (ctypes.PyDLL): releases it, lets another thread of its own take it
 * and keep it for hold_ms (as a C extension's long call does), and issues the all-reduce from a
 * native thread meanwhile: nobody can name Python frames while the call is first seen. Returns
 * when the all-reduce is done and the GIL is back. Python's C API is looked up in the process. */
struct GilHold {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int taken;
  unsigned hold_ms;
};

static void* HoldGil(void* arg) {
  struct GilHold* h = (struct GilHold*)arg;
  int (*ensure)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "PyGILState_Ensure");
  void (*release)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "PyGILState_Release");
  int state = ensure();
  pthread_mutex_lock(&h->mu);
  h->taken = 1;
  pthread_cond_signal(&h->cv);
  pthread_mutex_unlock(&h->mu);
  usleep(h->hold_ms * 1000u);
  release(state);
  return NULL;
}

__attribute__((visibility("default"))) int sim_all_reduce_with_gil_taken(void* comm, void* buf, size_t count,
                                                                        void* stream, unsigned hold_ms) {
  void* (*save)(void) = (void* (*)(void))dlsym(RTLD_DEFAULT, "PyEval_SaveThread");
  void (*restore)(void*) = (void (*)(void*))dlsym(RTLD_DEFAULT, "PyEval_RestoreThread");
  if (!save || !restore || !dlsym(RTLD_DEFAULT, "PyGILState_Ensure")) return -1;
  struct GilHold h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, hold_ms};
  pthread_t holder;
  void* thread_state = save();
  if (pthread_create(&holder, NULL, HoldGil, &h) != 0) {
    restore(thread_state);
    return -1;
  }
  pthread_mutex_lock(&h.mu);
  while (!h.taken) pthread_cond_wait(&h.cv, &h.mu);
  pthread_mutex_unlock(&h.mu);
  int result = sim_all_reduce_on_native_thread(comm, buf, count, stream);
  pthread_join(holder, NULL);
  restore(thread_state);
  return result;
}
