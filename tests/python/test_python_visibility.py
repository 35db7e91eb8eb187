#!/usr/bin/env python3
"""What a Python program sees of ncclwatch, and the exception its exit record names: each
scenario of visibility_job.py (one rank over the simulator, NCCL through ctypes) runs without
and with libncclwatch.so preloaded, and must end the same (status, stdout: the atexit callbacks
and the threads faulthandler lists, also during a hang in C code that keeps the GIL) with the
exception's __str__ run as often; the exit record names an exception only when one ended the
process, including one raised right after the first NCCL call, and with a worker thread alive.
    test_python_visibility.py BUILD_DIR
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import Checks, temp_dir  # noqa: E402

build = os.path.abspath(sys.argv[1])
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "visibility_job.py")
check = Checks(verbose=True)


def line_of(marker):
    with open(JOB) as f:
        return next(i for i, l in enumerate(f, 1) if marker in l)


class Run:
    def __init__(self, scenario, preload, env):
        tmp = temp_dir("ncclwatch-pyvis-")
        self.dumps = os.path.join(tmp, "dumps")
        str_log = os.path.join(tmp, "str.log")
        job_env = dict(os.environ, NCCLWATCH_DIR=self.dumps, NCCLWATCH_BLACKBOX_DIR=tmp, NCCLWATCH_RELAY_DIR=tmp,
                       NCCLWATCH_TIMEOUT="60", STR_LOG=str_log, **env)
        job_env.pop("LD_PRELOAD", None)
        if preload:
            job_env["LD_PRELOAD"] = os.path.join(build, "lib", "libncclwatch.so")
        p = subprocess.run([os.path.join(build, "bin", "simlaunch"), "-n", "1", "--timeout", "40", "--",
                            sys.executable, JOB, scenario], env=job_env, capture_output=True, text=True, timeout=90)
        self.out, self.err = p.stdout, p.stderr
        # The rank's own exit status, as the launcher tells it (its own is 1 for any failure).
        ended = [l for l in p.stderr.splitlines() if l.startswith("simlaunch: rank 0 ")]
        self.rc = ended[0].split()[-1] if ended else str(p.returncode)
        self.str_runs = open(str_log).read().count("__str__") if os.path.exists(str_log) else 0
        exits = [json.load(open(f))["summary"] for f in glob.glob(os.path.join(self.dumps, "rank*-exit.json"))]
        self.exit_record = exits[0] if exits else None


def same_as_without(scenario, **env):
    """Runs `scenario` without and with the library: the same status, stdout and __str__ runs.
    Returns the run with it."""
    name = f"{scenario} {env}"
    without, got = Run(scenario, False, env), Run(scenario, True, env)
    check(got.rc == without.rc, f"{name}: status {got.rc} with ncclwatch, {without.rc} without:\n{got.err[-1500:]}")
    check(got.out == without.out, f"{name}: stdout {got.out!r} with ncclwatch, {without.out!r} without")
    check(got.str_runs == without.str_runs,
          f"{name}: the exception's __str__ ran {got.str_runs} time(s) with ncclwatch, {without.str_runs} without")
    check(got.exit_record is not None, f"{name}: an exit record ({os.listdir(got.dumps) if os.path.isdir(got.dumps) else []})")
    return got


def exception_of(run):
    return (run.exit_record or {}).get("exception")


def says_exception(run, name, message, marker):
    e = exception_of(run) or {}
    want = {"type": "CountedError", "message": message, "file": JOB, "line": line_of(marker)}
    check(all(e.get(k) == v for k, v in want.items()), f"{name}: the exit record names {want}: {e}")


for api in ("cdll", "pydll"):
    # Raised within a millisecond of the first NCCL call (ncclCommInitRank), before any
    # watchdog tick. Its class has its own __str__: the record's message is its argument,
    # __str__ is not run again.
    got = same_as_without("early_raise", NCCL_API=api)
    check(got.rc == "1", f"early_raise {api}: status 1 ({got.rc})")
    says_exception(got, f"early_raise {api}", "right after the first NCCL call", "EARLY-RAISE-LINE")

# Handled exceptions left in sys.last_value (as code.interact leaves them, and assigned by the
# program itself), then exit 0 or sys.exit(3): nothing uncaught.
for scenario, status in (("last_value", "0"), ("last_value_exit3", "3")):
    got = same_as_without(scenario, NCCL_API="cdll")
    check(got.rc == status, f"{scenario}: status {status} ({got.rc})")
    check(exception_of(got) is None, f"{scenario}: no exception in the exit record ({exception_of(got)})")

# What Python code can see: atexit callbacks, faulthandler's threads; then an uncaught
# exception whose __str__ counts its runs.
got = same_as_without("look", NCCL_API="cdll")
check("atexit callbacks: " in got.out and "faulthandler threads: 1" in got.out, f"look: what it printed: {got.out!r}")
says_exception(got, "look", "looked", "LOOK-RAISE-LINE")

# A hang in C code that keeps the GIL from right after the first NCCL call: faulthandler's
# timer lists the threads that hold a thread state; none of ours.
for api in ("cdll", "pydll"):
    got = same_as_without("gil_hog", NCCL_API=api, WAIT_S="0")
    check("faulthandler threads during a hang: 1" in got.out, f"gil_hog {api}: {got.out!r}")

# The exception with other threads alive: a non-daemon worker calling NCCL (the interpreter
# waits for it before it finalizes), one that then ends the process with os._exit (no atexit
# function runs), a daemon thread in its NCCL loop.
got = same_as_without("worker_alive", NCCL_API="cdll")
says_exception(got, "worker_alive", "with a worker alive", "WORKER-RAISE-LINE")
got = same_as_without("worker_os_exit", NCCL_API="cdll")
check(got.rc == "1", f"worker_os_exit: status 1 ({got.rc})")
says_exception(got, "worker_os_exit", "then the worker's os._exit", "WORKER-EXIT-RAISE-LINE")
got = same_as_without("daemon_in_nccl", NCCL_API="cdll")
says_exception(got, "daemon_in_nccl", "with a daemon in NCCL", "DAEMON-RAISE-LINE")

sys.exit(check.finish())
