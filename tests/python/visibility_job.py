"""One rank of a Python job over the simulated NCCL (ctypes), run with and without
libncclwatch.so preloaded by test_python_visibility.py, which compares what it sees and how it
ends. After its first NCCL calls (ncclGetUniqueId, ncclCommInitRank; NCCL_API=pydll keeps the
GIL, cdll releases it) it does SCENARIO:
  early_raise   raises at once (within a millisecond of its first NCCL call): uncaught.
  last_value    after WAIT_S s, handles an exception as code.interact does (printed, left in
                sys.last_value / sys.last_type / sys.last_traceback), and assigns a caught one to
                sys.last_value (and sys.last_exc) itself, then exits 0: nothing uncaught.
  last_value_exit3  the same, then sys.exit(3): nothing uncaught either.
  look          after WAIT_S s, prints what Python code can see of the process: the number of
                atexit callbacks and of the threads faulthandler lists (all_threads=True), then
                raises a CountedError, whose __str__ appends a line to STR_LOG each time it runs
                (the interpreter runs it once, to print it).
  gil_hog       after WAIT_S s, hangs 2.5 s in C code that keeps the GIL while faulthandler's
                timer dumps every thread (dump_traceback_later, at 1.5 s), and prints how many
                it listed.
  worker_alive  starts a non-daemon threading.Thread that keeps calling NCCL, then raises in the
                main thread after WAIT_S s; the worker ends 1 s later (the interpreter waits for it).
  worker_os_exit  starts a non-daemon thread that calls NCCL while the main thread lives and
                then ends the process with os._exit(1); the main thread raises after WAIT_S s.
  daemon_in_nccl  starts a daemon thread that loops on all-reduces (in and out of NCCL), then
                raises in the main thread after WAIT_S s.
"""
import atexit
import code
import ctypes
import faulthandler
import os
import sys
import tempfile
import threading
import time

SCENARIO = sys.argv[1]
WAIT_S = float(os.environ.get("WAIT_S", "1.5"))
STR_LOG = os.environ.get("STR_LOG", "")

ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
api = ctypes.CDLL(None) if os.environ.get("NCCL_API") == "cdll" else ctypes.PyDLL(None)
sync_api = ctypes.CDLL(None)


class CountedError(Exception):
    def __str__(self):
        if STR_LOG:
            with open(STR_LOG, "a") as f:
                f.write("__str__\n")
        return "counted: " + self.args[0]


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def check(r, what):
    if r != 0:
        raise SystemExit(f"{what} failed: {r}")


def start_nccl():
    check(sync_api.cuInit(0), "cuInit")
    dev, ctx, stream, buf = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
    check(sync_api.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(sync_api.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(sync_api.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    check(sync_api.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
    check(sync_api.cuMemAlloc_v2(ctypes.byref(buf), ctypes.c_size_t(4096)), "cuMemAlloc")
    uid = UniqueId()
    check(api.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    comm = ctypes.c_void_p()
    check(api.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0), "ncclCommInitRank")
    return comm, ctx, stream, buf


def all_reduces(comm, ctx, stream, buf, until):
    check(sync_api.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    while time.monotonic() < until:
        check(api.ncclAllReduce(buf, buf, ctypes.c_size_t(1024), 7, 0, comm, stream), "ncclAllReduce")
        check(sync_api.cuStreamSynchronize(stream), "cuStreamSynchronize")
        time.sleep(0.01)


def end_when_main_ends(comm, ctx, stream, buf):
    """A framework's thread: works while the main thread lives, then ends the process itself
    (the interpreter waits for it before it finalizes: no atexit function runs)."""
    while threading.main_thread().is_alive():
        all_reduces(comm, ctx, stream, buf, time.monotonic() + 0.05)
    os._exit(1)


def faulthandler_threads():
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        text = f.read()
    return sum(1 for line in text.splitlines() if line.startswith(("Thread 0x", "Current thread 0x")))


def handle_like_code_interact():
    interp = code.InteractiveInterpreter()
    interp.runsource("int('not-a-number')")  # printed on stderr, left in sys.last_value
    try:
        {}["missing"]
    except KeyError as e:  # a program that keeps what it handled where the REPL would
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, e.__traceback__
        if hasattr(sys, "last_exc"):
            sys.last_exc = e


def main():
    comm, ctx, stream, buf = start_nccl()
    if SCENARIO == "early_raise":
        raise CountedError("right after the first NCCL call")  # EARLY-RAISE-LINE
    time.sleep(WAIT_S)
    if SCENARIO in ("last_value", "last_value_exit3"):
        handle_like_code_interact()
        print("handled", flush=True)
        if SCENARIO == "last_value_exit3":
            sys.exit(3)
        return
    if SCENARIO == "look":
        print(f"atexit callbacks: {atexit._ncallbacks()}", flush=True)
        print(f"faulthandler threads: {faulthandler_threads()}", flush=True)
        print(f"threading threads: {threading.active_count()}", flush=True)
        raise CountedError("looked")  # LOOK-RAISE-LINE
    if SCENARIO == "gil_hog":  # a hang in C code that keeps the GIL, as faulthandler's timer sees it
        with tempfile.TemporaryFile("w+") as f:
            faulthandler.dump_traceback_later(1.5, file=f)
            ctypes.PyDLL(None).usleep(2500000)  # GIL-HOG-LINE
            faulthandler.cancel_dump_traceback_later()
            f.seek(0)
            text = f.read()
        n = sum(1 for line in text.splitlines() if line.startswith(("Thread 0x", "Current thread 0x")))
        print(f"faulthandler threads during a hang: {n}", flush=True)
        return
    if SCENARIO == "worker_alive":
        worker = threading.Thread(target=all_reduces, args=(comm, ctx, stream, buf, time.monotonic() + WAIT_S + 1))
        worker.start()
        time.sleep(WAIT_S)
        raise CountedError("with a worker alive")  # WORKER-RAISE-LINE
    if SCENARIO == "worker_os_exit":
        threading.Thread(target=end_when_main_ends, args=(comm, ctx, stream, buf)).start()
        time.sleep(WAIT_S)
        raise CountedError("then the worker's os._exit")  # WORKER-EXIT-RAISE-LINE
    if SCENARIO == "daemon_in_nccl":
        threading.Thread(target=all_reduces, args=(comm, ctx, stream, buf, time.monotonic() + 3600), daemon=True).start()
        time.sleep(WAIT_S)
        raise CountedError("with a daemon in NCCL")  # DAEMON-RAISE-LINE
    raise SystemExit(f"unknown scenario {SCENARIO}")


if __name__ == "__main__":
    main()
