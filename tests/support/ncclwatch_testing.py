"""What the Python test scripts share: checks and how they are reported, temporary directories,
running processes, and waiting on a real condition (a file, a line, a process state) instead of
sleeping. Deadlines are generous: the CI runs tests side by side on 2 shared cores, and a
deadline is only reached when something is broken.

Scripts find it with  sys.path.insert(0, <their dir>/../support).  Python 3.9+ (the stack tests
run under every pyenv CPython from 3.9 on).
"""
import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77  # ctest's SKIP_RETURN_CODE
DEADLINE_S = 60.0


class Failure(Exception):
    """A failed check: ends the case it is in."""


def check(cond, what):
    if not cond:
        raise Failure(what)


class Checks:
    """Checks that go on after a failure, for scripts of many independent facts: each failure
    is printed at once (each pass too when verbose), and finish() gives the exit status."""

    def __init__(self, verbose=False, out=sys.stdout):
        self.passed, self.failed = [], []
        self.verbose, self.out = verbose, out

    def __call__(self, cond, what):
        (self.passed if cond else self.failed).append(what)
        if not cond or self.verbose:
            print(("ok   " if cond else "FAIL ") + what, file=self.out, flush=True)
        return bool(cond)

    def finish(self):
        print(f"{len(self.passed)} passed, {len(self.failed)} failed", flush=True)
        if self.failed:
            keep_temp_dirs()
        return 1 if self.failed else 0


def run_cases(cases, names):
    """Runs the named cases (every one when none), one PASS, FAIL or SKIP line each (a case
    returning SKIP is skipped); the exit status, SKIP when nothing failed and one skipped."""
    failed = skipped = 0
    for name in names or list(cases):
        start = time.time()
        try:
            if cases[name]() == SKIP:
                skipped += 1
                print(f"SKIP {name}", flush=True)
                continue
            print(f"PASS {name} ({time.time() - start:.1f} s)", flush=True)
        except Failure as f:
            failed += 1
            print(f"FAIL {name}: {f}", flush=True)
        except Exception as e:  # a broken dump or a crash of the test itself is a failure too
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
    if failed:
        keep_temp_dirs()
    return 1 if failed else SKIP if skipped else 0


# ---- temporary directories --------------------------------------------------------------------
_temp_dirs = []


def temp_dir(prefix="ncclwatch-test-"):
    """A fresh directory under $TMPDIR of its own (tests run side by side never share a path),
    removed when the script ends unless a check failed (then kept, and named, to look at)."""
    path = tempfile.mkdtemp(prefix=prefix)
    _temp_dirs.append(path)
    return path


def keep_temp_dirs():
    if _temp_dirs:
        print("kept for a look: " + " ".join(_temp_dirs), flush=True)
    _temp_dirs.clear()


@atexit.register
def _remove_temp_dirs():
    for path in _temp_dirs:
        shutil.rmtree(path, ignore_errors=True)


# ---- processes ----------------------------------------------------------------------------------
def node_dirs(parent):
    """A host's node-local directories of its own, made under `parent` (black boxes, the request
    relay), as the settings that point a job at them."""
    dirs = {"NCCLWATCH_BLACKBOX_DIR": os.path.join(parent, "boxes"), "NCCLWATCH_RELAY_DIR": os.path.join(parent, "relay")}
    for d in dirs.values():
        os.makedirs(d)
    return dirs


_node_dirs = None


def clean_env(**extra):
    """The environment without ncclwatch's settings or a caller's preload, plus `extra`. The
    node-local directories (black boxes, the request relay) are this script's own, in its
    temporary directory: a test writes nowhere else (not even a caretaker's lock in /dev/shm)."""
    global _node_dirs
    if _node_dirs is None:
        _node_dirs = node_dirs(temp_dir("ncclwatch-node-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    env.update(_node_dirs)
    env.update(extra)
    return env


def run(cmd, **kw):
    """subprocess.run with its output captured as text."""
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _stat_fields(pid, tid=None):
    """/proc/PID[/task/TID]/stat after the command name: state, ppid, ..."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    return read_text(path).rsplit(")", 1)[-1].split()


def child_pids(pid):
    """Pids of the children of `pid` (a launcher's ranks)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            fields = _stat_fields(d)
            if len(fields) > 1 and int(fields[1]) == pid:
                out.append(int(d))
    return out


def thread_state(pid, tid=None):
    """The state letter of a process or thread (R running, S sleeping, ...); '' when gone."""
    fields = _stat_fields(pid, tid)
    return fields[0] if fields else ""


def catches(pid, sig):
    """Whether process `pid` has a handler for `sig` (SigCgt in /proc/PID/status)."""
    for line in read_text(f"/proc/{pid}/status").splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    return False


def blocked_in_syscall(pid, number, tid=None):
    """Whether a thread (the main one by default) is blocked in syscall `number`
    (/proc/PID/syscall; x86-64 numbers: 230 clock_nanosleep, 202 futex)."""
    path = f"/proc/{pid}/syscall" if tid is None else f"/proc/{pid}/task/{tid}/syscall"
    fields = read_text(path).split()
    return bool(fields) and fields[0] == str(number)


# ---- waiting ------------------------------------------------------------------------------------
def wait_for(ready, what, timeout=DEADLINE_S, interval=0.02):
    """Polls ready() until it returns something true, and returns that; at the deadline
    (reached only when something is broken) raises Failure naming what it waited for."""
    deadline = time.monotonic() + timeout
    while True:
        got = ready()
        if got:
            return got
        if time.monotonic() > deadline:
            raise Failure(f"waited {timeout:.0f} s for {what}")
        time.sleep(interval)


def wait_for_ranks(launcher, n, ready=lambda pid: True, what="", timeout=DEADLINE_S):
    """The pids of the launcher's `n` ranks once each satisfies ready(pid)."""
    def all_ready():
        pids = child_pids(launcher.pid)
        if launcher.poll() is not None:
            raise Failure(f"the job ended (exit {launcher.returncode}) while waiting for {what or 'its ranks'}")
        return len(pids) == n and all(ready(p) for p in pids) and pids
    return wait_for(all_ready, f"{n} ranks {what}".strip(), timeout)


# ---- ending a job once a test has what it waits for ------------------------------------------
def dumped(directory, ranks, reasons=None):
    """A condition: each of `ranks` has a dump in `directory` (one whose reason is in `reasons`,
    when given). Dumps appear whole (written aside, then renamed)."""
    want = set(ranks)

    def ready():
        have = set()
        try:
            names = os.listdir(directory)
        except OSError:
            return False
        for name in names:
            m = re.match(r"rank(\d+)-.*-([a-z_]+)\.json$", name)
            if m and (reasons is None or m.group(2) in reasons):
                have.add(int(m.group(1)))
        return want <= have
    return ready


def all_of(*conditions):
    return lambda: all(c() for c in conditions)


def end_time_limit_when(launcher_pid, ready, margin_s=1.0):
    """Watches (a thread) until ready() holds, then, `margin_s` later, sends SIGUSR1 to simlaunch
    (`launcher_pid()`: its pid, 0 while not known yet, None once the job ended), which ends its
    time limit now: SIGTERM to every rank, SIGKILL 5 s later, exit 124, as at its --timeout. A hung job that
    has written what the test waits for ends as its time limit would end it, without waiting the
    limit out; when ready() never holds, the limit ends it as before."""
    def watch():
        while launcher_pid() is not None:
            if ready():
                time.sleep(margin_s)
                pid = launcher_pid()
                if pid:
                    try:
                        os.kill(pid, signal.SIGUSR1)
                    except ProcessLookupError:
                        pass
                return
            time.sleep(0.1)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def launcher_of(popen):
    """For end_time_limit_when: the pid of a simlaunch started with Popen while it runs."""
    return lambda: popen.pid if popen.poll() is None else None
