"""lib/stacks inside a real CPython process (run by ctest with the probe library's path).

Loads the probe through ctypes: PyDLL calls keep the GIL (a spin there holds the GIL), CDLL
calls release it (as PyTorch does around collectives); CaptureCallsite records the caller's
Python frames either way. Checks the script's own file and exact lines in call sites (from the
main thread, a thread pool, a native thread) and thread stacks (in a forked child too), that a
call site whose code object was freed is never named after it, and that a thread holding the
GIL only costs the bounded wait. Prints what it got as JSON.
"""
import concurrent.futures
import ctypes
import gc
import json
import multiprocessing
import os
import weakref
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import SKIP, Checks, wait_for  # noqa: E402

if sys.version_info < (3, 9):
    print("Python %s has no PyFrame_GetCode/PyFrame_GetBack: Python stacks unsupported, test skipped"
          % sys.version.split()[0])
    sys.exit(SKIP)

THIS_FILE = os.path.realpath(__file__)
LIB = sys.argv[1]
keep_gil = ctypes.PyDLL(LIB, mode=ctypes.RTLD_GLOBAL)
drop_gil = ctypes.CDLL(LIB, mode=ctypes.RTLD_GLOBAL)
for lib in (keep_gil, drop_gil):
    lib.nw_callsite_json.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.nw_threads_json.argtypes = [ctypes.c_int] * 4 + [ctypes.c_char_p, ctypes.c_int]
    lib.nw_spin_holding_gil.argtypes = [ctypes.c_double]
    lib.nw_capture_cost_ns.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.nw_capture_cost_ns.restype = ctypes.c_double
    lib.nw_python_callsite_problem.argtypes = [ctypes.c_char_p, ctypes.c_int]

check = Checks(out=sys.stderr)


def line_of(tag):
    """Line number of the line of this file that ends with the marker '# LINE:<tag>'."""
    with open(THIS_FILE) as source:
        for number, text in enumerate(source, 1):
            if text.rstrip().endswith("# LINE:" + tag):
                return number
    raise AssertionError("no marker " + tag)


def call_json(function, *args):
    size = 1 << 16
    while True:
        buffer = ctypes.create_string_buffer(size)
        needed = function(*args, buffer, size)
        if needed <= size:
            return json.loads(buffer.value.decode())
        size = needed


def same_file(path):
    return bool(path) and os.path.realpath(path) == THIS_FILE


def has_frame(frames, function, tag):
    return any(same_file(f["file"]) and f["function"] == function and f["line"] == line_of(tag) for f in frames)


def thread_entry(capture, tid):
    return next((t for t in capture["threads"] if t["tid"] == tid), None)


# ---- call sites ----
def issue_collective(lib):
    return lib.nw_capture_callsite(0, 16)  # LINE:capture


def training_step(lib):
    return issue_collective(lib)  # LINE:step


def check_python_frames(site, expected, what):
    """`site`'s innermost Python frames are `expected` [(function, line tag)], in this file."""
    python = site["python"]
    check(site["note"] == "", what + ": call site names resolved: " + site["note"])
    check(len(python) >= len(expected), what + ": call site has Python frames: %s" % python)
    for frame, (function, tag) in zip(python, expected):
        check(same_file(frame["file"]) and frame["function"] == function and frame["line"] == line_of(tag)
              and not frame["library"], "%s: call-site frame %s line %d: got %s" % (what, function, line_of(tag), frame))
    check(not any("PyEval" in s or "PyObject_" in s for s in site["symbols"]),
          what + ": native frames stop at the interpreter when Python frames are recorded: %s" % site["symbols"])


def check_callsites():
    ids = []
    for _ in range(3):
        ids.append(training_step(keep_gil))  # LINE:loop
    other_line = training_step(keep_gil)  # LINE:other
    without_gil = []
    for _ in range(3):
        without_gil.append(training_step(drop_gil))  # LINE:nogil
    check(ids[0] >= 0 and ids.count(ids[0]) == 3, "same Python line, same id: %s" % ids)
    check(other_line >= 0 and other_line != ids[0], "another Python line, another id")
    check(without_gil[0] >= 0 and without_gil.count(without_gil[0]) == 3 and without_gil[0] not in ids,
          "without the GIL: same line, same id, another than with it: %s" % without_gil)

    site = call_json(drop_gil.nw_callsite_json, ids[0], 2000)
    print(json.dumps({"callsite": site}, indent=1))
    python = site["python"]
    check(site["note"] == "", "call site names resolved: " + site["note"])
    check(len(python) >= 3, "call site has Python frames")
    expected = [("issue_collective", "capture"), ("training_step", "step"), ("check_callsites", "loop")]
    for frame, (function, tag) in zip(python, expected):
        check(same_file(frame["file"]) and frame["function"] == function and frame["line"] == line_of(tag)
              and not frame["library"], "call-site frame %s line %d: got %s" % (function, line_of(tag), frame))
    check("nw_capture_callsite" in site["symbols"][0], "native frame 0 is the probe: %s" % site["symbols"][:2])
    check(not any("PyEval" in s or "PyObject_" in s for s in site["symbols"]),
          "native frames stop at the interpreter when Python frames are recorded: %s" % site["symbols"])

    # The GIL released around the call, as PyTorch does: the caller's frames all the same.
    gil_free = call_json(drop_gil.nw_callsite_json, without_gil[0], 2000)
    print(json.dumps({"callsite_without_gil": gil_free}, indent=1))
    check_python_frames(gil_free, [("issue_collective", "capture"), ("training_step", "step"),
                                   ("check_callsites", "nogil")], "without the GIL")
    check("nw_capture_callsite" in gil_free["symbols"][0], "native frame 0 is the probe: %s" % gil_free["symbols"][:2])

    # A thread that never ran Python code (autograd's, NCCL's own) records none of its own: its
    # call site carries the driving thread's (the main thread's, waiting for it here), so marked.
    native = call_json(drop_gil.nw_callsite_json, drop_gil.nw_capture_on_native_thread(16), 2000)
    check(native["symbols"] and native.get("driven_from") == "main thread" and
          any(f["function"] == "check_callsites" for f in native["python"]),
          "a native thread's call site has the driving main thread's Python frames, marked: %s" % native)


def pooled_step():
    return training_step(drop_gil)  # LINE:pooled


def check_thread_pool():
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        site = pool.submit(pooled_step).result()
    pooled = call_json(drop_gil.nw_callsite_json, site, 2000)
    print(json.dumps({"callsite_in_pool": pooled}, indent=1))
    check_python_frames(pooled, [("issue_collective", "capture"), ("training_step", "step"), ("pooled_step", "pooled")],
                        "thread pool")
    outer = pooled["python"][3:4]
    check(outer and outer[0]["library"] and outer[0]["file"].endswith(os.path.join("concurrent", "futures", "thread.py")),
          "thread pool: the pool's worker below, as library code: %s" % outer)


def check_code_freed():
    """A call site made without the GIL only borrows its code objects: once freed, never named."""
    namespace = {}
    exec(compile("def ephemeral(lib):\n    return lib.nw_capture_callsite(0, 16)\n", "<ephemeral>", "exec"), namespace)
    code = weakref.ref(namespace["ephemeral"].__code__)
    site = namespace["ephemeral"](drop_gil)  # LINE:ephemeral
    del namespace
    gc.collect()
    check(code() is None, "the exec'd function's code object is freed")
    freed = call_json(drop_gil.nw_callsite_json, site, 2000)
    print(json.dumps({"callsite_code_freed": freed}, indent=1))
    python = freed["python"]
    check(len(python) >= 2 and python[0]["function"] != "ephemeral" and python[0]["file"] != "<ephemeral>",
          "a freed code object is not named after it: %s" % python[:1])
    check(not python or python[0]["function"] != "" or "no longer exists" in freed["note"],
          "an unnamed frame has a note: %s" % freed["note"])
    check(len(python) >= 2 and same_file(python[1]["file"]) and python[1]["function"] == "check_code_freed"
          and python[1]["line"] == line_of("ephemeral"), "its live caller is still named: %s" % python[1:2])


# ---- thread stacks ----
release = threading.Event()


def waiter():
    release.wait()  # LINE:event_wait


def sleeper():
    while not release.is_set():
        time.sleep(0.05)  # LINE:sleep


def parked_at(thread, function, tag, innermost):
    """Whether the thread's Python stack is at `function`'s line `tag` (its innermost frame, or
    any frame below a library one)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == function and frame.f_lineno == line_of(tag):
            return True
        if innermost:
            return False
        frame = frame.f_back
    return False


def check_thread_stacks():
    parked = [threading.Thread(target=waiter, name="py-waiter", daemon=True),
              threading.Thread(target=sleeper, name="py-sleeper", daemon=True)]
    for thread in parked:
        thread.start()
    wait_for(lambda: parked_at(parked[0], "waiter", "event_wait", innermost=False)
             and parked_at(parked[1], "sleeper", "sleep", innermost=True), "the parked threads at their lines")

    result = {}

    def dumper():
        result["capture"] = call_json(drop_gil.nw_threads_json, 1000, 2000, 0, -1)  # LINE:dumper

    thread = threading.Thread(target=dumper, name="py-dumper")
    thread.start()
    thread.join()  # LINE:join
    capture = result["capture"]
    print(json.dumps({"threads": capture}, indent=1))
    check(capture["note"] == "", "python stacks taken: " + capture["note"])

    main = thread_entry(capture, os.getpid())
    check(main is not None and has_frame(main["python"], "check_thread_stacks", "join"), "main thread at its join line")
    check(main is not None and main["python"] and main["python"][0]["library"], "Thread.join is library code")
    w = thread_entry(capture, parked[0].native_id)
    check(w is not None and has_frame(w["python"], "waiter", "event_wait"), "waiter at its Event.wait line")
    check(w is not None and w["python"] and w["python"][0]["library"]
          and w["python"][0]["file"].endswith("threading.py"), "waiter's innermost frame is in threading.py")
    with open("/proc/self/task/%d/comm" % parked[0].native_id) as comm:
        check(w is not None and w["name"] == comm.read().strip(), "native thread name from comm")
    check(w is not None and len(w["symbols"]) > 0, "waiter has a native stack")
    s = thread_entry(capture, parked[1].native_id)
    check(s is not None and s["python"] and s["python"][0]["function"] == "sleeper"
          and s["python"][0]["line"] == line_of("sleep"), "sleeper's innermost frame is its time.sleep line")
    d = thread_entry(capture, thread.native_id)
    check(d is not None and has_frame(d["python"], "dumper", "dumper"), "the dumping thread's own Python frames")

    # Called with the GIL held: the Python part runs on the calling thread.
    inline = call_json(keep_gil.nw_threads_json, 1000, 2000, 0, -1)  # LINE:inline
    main = thread_entry(inline, os.getpid())
    check(main is not None and has_frame(main["python"], "check_thread_stacks", "inline"),
          "GIL held by the caller: its own frames, taken in place")
    release.set()
    for t in parked:
        t.join()


def in_forked_child(conn):
    conn.send(call_json(drop_gil.nw_threads_json, 1000, 2000, 0, -1))  # LINE:forked
    conn.close()


def check_forked_child():
    """multiprocessing with fork: the child's threading module still says its parent's native_id."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=in_forked_child, args=(sender,))
    child.start()
    capture = receiver.recv() if receiver.poll(60) else {"threads": [], "note": "no answer from the child"}
    child.join(60)
    print(json.dumps({"forked_child": capture}, indent=1))
    main = thread_entry(capture, child.pid)
    check(main is not None and has_frame(main["python"], "in_forked_child", "forked"),
          "forked child: its main thread's Python stack: %s" % (main and main["python"][:3]))
    check(all(t["tid"] != -1 for t in capture["threads"]),
          "forked child: no Python thread left unmatched: %s" % [t["note"] for t in capture["threads"] if t["tid"] == -1])


def check_gil_held_elsewhere():
    per_thread_ms, gil_ms, spin_s = 200, 300, 3.0
    result = {}
    fresh = keep_gil.nw_capture_callsite(0, 16)  # LINE:fresh

    def late_dumper():
        # Waits 300 ms without the GIL, then captures while the main thread spins holding it.
        result["capture"] = call_json(drop_gil.nw_threads_json, per_thread_ms, gil_ms, 300, fresh)

    thread = threading.Thread(target=late_dumper, name="py-late-dumper")
    thread.start()
    time.sleep(0.05)
    keep_gil.nw_spin_holding_gil(spin_s)  # LINE:spin
    thread.join()
    capture = result["capture"]
    print(json.dumps({"gil_held": capture}, indent=1))
    check(capture["elapsed_ms"] < gil_ms + per_thread_ms + 700,
          "bounded by the timeouts, not the %.0f s spin: %.0f ms" % (spin_s, capture["elapsed_ms"]))
    check("GIL" in capture["note"], "note says the GIL was not available: " + capture["note"])
    main = thread_entry(capture, os.getpid())
    check(main is not None and "GIL" in main["note"], "the main thread's entry carries the note")
    check(main is not None and any("nw_spin_holding_gil" in s for s in main["symbols"]),
          "native stack shows the spinning function")
    check(main is not None and any(f["function"] == "check_gil_held_elsewhere" for f in main["python"]),
          "the spinning main thread's Python frames, read without the GIL: %s" % (main and main["python"]))
    unnamed = capture["callsite"]
    check("not named" in unnamed["note"] and unnamed["python"] and unnamed["python"][0]["file"] == "",
          "a call site resolved without the GIL has unnamed Python frames and a note: %s" % unnamed)

    # Once the GIL is free again, the helper gets it and names and stacks come back.
    named = call_json(drop_gil.nw_callsite_json, fresh, 2000)
    check(named["note"] == "" and has_frame(named["python"], "check_gil_held_elsewhere", "fresh"),
          "named once the GIL is free: %s" % named)
    again = call_json(drop_gil.nw_threads_json, 500, 1000, 0, -1)
    check(again["note"] == "", "python stacks available again: " + again["note"])


def report_cost():
    """Mean CPU ns per CaptureCallsite with the GIL held (best of 5 runs), from a call ~10
    Python frames deep; for the record, not a check."""
    iterations = int(os.environ.get("STACKS_COST_ITERATIONS", "20000"))

    def nested(levels, depth):
        if levels == 0:
            return min(keep_gil.nw_capture_cost_ns(iterations, depth) for _ in range(5))
        return nested(levels - 1, depth)

    for depth in (8, 16, 32):
        ns = nested(8, depth)
        print(json.dumps({"capture_with_gil_cpu_ns": round(ns, 1), "native_depth": depth, "python": sys.version.split()[0]}))


check(drop_gil.nw_install(signal.SIGRTMIN + 5) == 1, "stack signal installed")
problem = call_json(drop_gil.nw_python_callsite_problem)
check(problem == "", "Python %s's frame layout is known: %s" % (sys.version.split()[0], problem))
check_callsites()
check_thread_pool()
check_code_freed()
check_thread_stacks()
check_forked_child()
check_gil_held_elsewhere()
report_cost()
sys.exit(check.finish())
