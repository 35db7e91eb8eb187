"""A Python training loop in miniature, driving the simulated NCCL through ctypes, with
libncclwatch.so preloaded. NCCL calls are looked up globally (dlsym of the process, where the
preloaded ncclwatch comes first). NCCL_API=pydll (the default) makes them with the GIL held
(ctypes.PyDLL), NCCL_API=cdll releases it around each call (ctypes.CDLL), as PyTorch's c10d
bindings do; POOL=1 runs each training step on a worker of a ThreadPoolExecutor. Either way
ncclwatch records this file's line as each operation's Python call site. Rank BUSY_RANK "saves a
checkpoint" at step BUSY_STEP; the other ranks wait in an all-reduce.
Endings: rank DIE_RANK is SIGKILLed at step DIE_STEP (the OOM killer's way; half a second after
its last step, or right after it with DIE_NOW=1; DIE_SIGNAL=STOP: SIGSTOPped instead, as a
debugger or Ctrl-Z stops it); rank EXIT_RANK leaves
the loop at step EXIT_STEP; FORK=1 runs the job in a child started by multiprocessing's fork
context, which ends it with os._exit (as launchers built on multiprocessing do). Rank END_RANK ends
at step END_STEP by ENDING: `raise` (a DataError from read_sample: a data bug), `raise_builtin` (a
ValueError), `sysexit` (sys.exit(3)) or `osexit` (os._exit(4)); with ABORT_IN_FINALLY=1 every rank
aborts its communicator in a `finally:` on its way out (as dist.destroy_process_group() does).
WATCHDOG_S=T starts a framework-like watchdog thread on every rank, as PyTorch's ProcessGroupNCCL
has: a step's collective not finished after T seconds aborts the communicator (ncclCommAbort),
then the process (abort(): SIGABRT; WATCHDOG_ENDING=exit: sys-level exit status 6 instead).
Rank HOLD_RANK at step HOLD_STEP waits 4 s without the GIL, then in C code that keeps it
(HOLD_HOW=spin: in a pure-Python loop that no other thread can take the GIL from).
GIL_HOG_RANK=R (with NATIVE_ISSUER): on rank R, the first step's native all-reduce is issued
while a thread keeps the GIL in C code for GIL_HOG_S seconds (default 2: a C extension's long
call): the first sight of that call site cannot name its Python frames.
"""
import concurrent.futures
import ctypes
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import check as check_that, wait_for  # noqa: E402

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
BUSY_RANK, BUSY_STEP = int(os.environ.get("BUSY_RANK", "1")), int(os.environ.get("BUSY_STEP", "5"))
DIE_RANK, DIE_STEP = int(os.environ.get("DIE_RANK", "-1")), int(os.environ.get("DIE_STEP", "-1"))
EXIT_RANK, EXIT_STEP = int(os.environ.get("EXIT_RANK", "-1")), int(os.environ.get("EXIT_STEP", "-1"))
END_RANK, END_STEP = int(os.environ.get("END_RANK", "-1")), int(os.environ.get("END_STEP", "-1"))
ENDING = os.environ.get("ENDING", "")
HOLD_RANK, HOLD_STEP = int(os.environ.get("HOLD_RANK", "-1")), int(os.environ.get("HOLD_STEP", "-1"))
WATCHDOG_S = float(os.environ.get("WATCHDOG_S", "0"))
GIL_HOG_RANK, GIL_HOG_S = int(os.environ.get("GIL_HOG_RANK", "-1")), float(os.environ.get("GIL_HOG_S", "2"))

ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
# NCCL calls keep the GIL (PyDLL) or release it (CDLL): their Python call site is recorded either way.
api = ctypes.CDLL(None) if os.environ.get("NCCL_API") == "cdll" else ctypes.PyDLL(None)
sync_api = ctypes.CDLL(None)  # waits release the GIL, as PyTorch does
# NATIVE_ISSUER=<path of libsim_native_issuer.so>: each step's all-reduce is issued by a C thread
# (WORKER=1: by one long-lived worker that waits for its next task in between, as DDP's autograd
# thread does).
NATIVE_ISSUER = ctypes.CDLL(os.environ["NATIVE_ISSUER"]) if os.environ.get("NATIVE_ISSUER") else None
if NATIVE_ISSUER is not None:
    native_all_reduce = (NATIVE_ISSUER.sim_all_reduce_on_worker if os.environ.get("WORKER") == "1"
                         else NATIVE_ISSUER.sim_all_reduce_on_native_thread)
    native_all_reduce.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_size_t, ctypes.c_void_p]
    # Called with the GIL held (PyDLL): it hands the GIL to a thread of its own (GIL_HOG_RANK).
    native_all_reduce_with_gil_taken = ctypes.PyDLL(os.environ["NATIVE_ISSUER"]).sim_all_reduce_with_gil_taken
    native_all_reduce_with_gil_taken.argtypes = native_all_reduce.argtypes + [ctypes.c_uint]


def check(r, what):
    check_that(r == 0, f"{what} failed: {r}")


def exchange_id():
    uid = ctypes.create_string_buffer(128)
    path = os.path.join(os.environ["NCCLWATCH_SIM_RUNDIR"], "py-nccl-id")
    if RANK == 0:
        check(api.ncclGetUniqueId(uid), "ncclGetUniqueId")
        with open(path + ".tmp", "wb") as f:
            f.write(uid.raw)
        os.rename(path + ".tmp", path)
    else:
        wait_for(lambda: os.path.exists(path), f"rank 0's {path}")
        with open(path, "rb") as f:
            uid = ctypes.create_string_buffer(f.read(), 128)
    return uid


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def save_checkpoint():
    time.sleep(600)  # BUSY-LINE: where the busy rank is when everybody dumps (the behaviour under test)


class DataError(Exception):
    pass


def parse_record(raw):
    return int(raw, 16)  # BUILTIN-RAISE-LINE: ValueError for a bad record


def read_sample(index):
    raise DataError(f"sample {index} of shard {RANK} is corrupt")  # RAISE-LINE


def next_batch(step):
    """Where a rank's own bug ends it (ENDING)."""
    if RANK != END_RANK or step != END_STEP:
        return
    time.sleep(1)  # a moment into the job, as such bugs come
    if ENDING == "raise":
        read_sample(17 * step)
    elif ENDING == "raise_builtin":
        parse_record("not-hex")
    elif ENDING == "sysexit":
        sys.exit(3)
    elif ENDING == "osexit":
        os._exit(4)


def hold_the_gil():
    time.sleep(4)  # GIL-FREE-LINE: the first dumps of its peers' stall see it here
    if os.environ.get("HOLD_HOW") == "spin":
        spin_in_python()
    ctypes.PyDLL(None).sleep(600)  # GIL-HELD-LINE: C code that keeps the GIL (a C extension in a loop, a regex)


def spin_in_python():
    # A switch interval longer than the job: no other thread is given the GIL while this runs.
    sys.setswitchinterval(3600)
    n = 0
    while True:
        n += 1  # GIL-SPIN-LINE


step_started = [None]  # when the current step's collective was issued; None between steps


def framework_watchdog(comm):
    """The framework's watchdog thread: a collective past WATCHDOG_S aborts the communicator,
    then the process, as PyTorch's does (TORCH_NCCL_ASYNC_ERROR_HANDLING)."""
    while True:
        time.sleep(0.05)
        since = step_started[0]
        if since is None or time.monotonic() - since < WATCHDOG_S:
            continue
        print(f"rank {RANK}: watchdog: collective timed out after {WATCHDOG_S} s; aborting", file=sys.stderr, flush=True)
        sync_api.ncclCommAbort(comm)  # WATCHDOG-ABORT-LINE
        if os.environ.get("WATCHDOG_ENDING") == "exit":
            os._exit(6)
        os.abort()


def train_step(comm, buf, count, stream):
    step_started[0] = time.monotonic()  # for the framework's watchdog (WATCHDOG_S)
    if NATIVE_ISSUER is not None:  # the all-reduce comes from a C thread; this one waits for it
        issue, args = native_all_reduce, [comm, buf, ctypes.c_size_t(count), stream]
        if RANK == GIL_HOG_RANK and not getattr(train_step, "hogged", False):
            train_step.hogged = True  # its first call: another thread keeps the GIL while it is first seen
            issue, args = native_all_reduce_with_gil_taken, args + [int(GIL_HOG_S * 1000)]
        check(issue(*args), "all-reduce on a native thread")  # DRIVER-LINE
        return
    check(api.ncclAllReduce(buf, buf, ctypes.c_size_t(count), 7, 0, comm, stream), "ncclAllReduce")  # CALL-LINE
    check(sync_api.cuStreamSynchronize(stream), "cuStreamSynchronize")
    step_started[0] = None


def main():
    check(sync_api.cuInit(0), "cuInit")
    dev, ctx, stream, buf = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
    check(sync_api.cuDeviceGet(ctypes.byref(dev), RANK % 8), "cuDeviceGet")
    check(sync_api.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(sync_api.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    check(sync_api.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
    count = 1024
    check(sync_api.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(count * 4)), "cuMemAlloc")
    uid = UniqueId.from_buffer_copy(exchange_id().raw)
    comm = ctypes.c_void_p()
    check(api.ncclCommInitRank(ctypes.byref(comm), WORLD, uid, RANK), "ncclCommInitRank")
    if WATCHDOG_S > 0:
        threading.Thread(target=framework_watchdog, args=(comm,), daemon=True).start()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1) if os.environ.get("POOL") == "1" else None
    try:
        for step in range(50):
            next_batch(step)
            if step == BUSY_STEP and RANK == BUSY_RANK:
                save_checkpoint()
            if step == HOLD_STEP and RANK == HOLD_RANK:
                hold_the_gil()
            if step == EXIT_STEP and RANK == EXIT_RANK:
                print("ok (left early)", flush=True)
                return
            if step == DIE_STEP and RANK == DIE_RANK:
                if os.environ.get("DIE_NOW") != "1":
                    time.sleep(0.5)  # long enough for ncclwatch's watchdog to have seen this step's call site
                os.kill(os.getpid(), signal.SIGSTOP if os.environ.get("DIE_SIGNAL") == "STOP" else signal.SIGKILL)
            if pool:
                pool.submit(train_step, comm, ctypes.c_void_p(buf.value), count, stream).result()
            else:
                train_step(comm, ctypes.c_void_p(buf.value), count, stream)
        print("ok", flush=True)
    finally:
        if os.environ.get("ABORT_IN_FINALLY") == "1":
            api.ncclCommAbort(comm)


if __name__ == "__main__":
    if os.environ.get("FORK") == "1":
        import multiprocessing
        def child_main():
            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: stopped with the rank the launcher started
            main()
        child = multiprocessing.get_context("fork").Process(target=child_main)
        child.start()
        child.join()
        sys.exit(child.exitcode)
    main()
