"""Signals and the application's waits (issue 44, items 3 and 7): a dump never cuts a wait short
(a thread seen running is looked at again, and unwound where it waits, before any signal); the
on-demand signal cuts the wait of the thread it lands on, and says so; a fault the application
handles and retries is no crash (no dump, no wait), while one its handler gives back to the
default action still ends with its dump. Each against the same program without the library."""
import os
import re
import signal
import subprocess
import time

from cases_harm import same_as_without
from e2e_common import built, case, long_case, job, rank_pid, serial_case
from ncclwatch_testing import check, temp_dir


def wait_app(scenario, preload, after=None, n=1, env=None, timeout=60, args=()):
    """Runs e2e_wait_app `scenario`; after(p, cwd, dumps) runs once it says it is ready (the file
    "ready" in its directory). Returns (Job, the launcher's lines about ranks)."""
    cwd = temp_dir("ncclwatch-e2e-wait-")
    dumps = os.path.join(cwd, "dumps")

    def after_start(p):
        if after is None:
            return
        for _ in range(600):
            if os.path.exists(os.path.join(cwd, "ready")) or p.poll() is not None:
                break
            time.sleep(0.05)
        after(p, cwd, dumps)

    j = job(n, [scenario] + list(args), env={"NCCLWATCH_TIMEOUT": "600", "NCCLWATCH_DIR": dumps,
                                "E2E_READY_FILE": os.path.join(cwd, "ready"), **(env or {})},
            timeout=timeout, preload=preload, program="e2e_wait_app", cwd=cwd, after_start=after_start)
    j.dir = dumps
    return j, [l for l in j.err.splitlines() if l.startswith("simlaunch: rank ")]


def job_wide_dump(dumps, wait=10):
    r = subprocess.run([built("bin", "ncclwatch"), "dump", dumps, "--wait", str(wait)], capture_output=True,
                       text=True, timeout=60)
    return r


@case
def dumps_keep_short_sleeps_whole():
    # 50 us of work (10 us: the worst case, most sleeps entered right after a look), then a 50 us
    # nanosleep, over and over, on the main thread and on 8 threads that called NCCL (all
    # sampled by every dump), through 10 job-wide dumps: a thread seen running enters its sleep
    # microseconds later, and a stack signal then would make that nanosleep return EINTR (10-13
    # times per 10 dumps with 10 us of work before this was fixed). Not one does, as without.
    for work_us in ("10", "50"):
        def run(scenario, preload):
            def ten_dumps(p, cwd, dumps):
                time.sleep(0.3)
                for _ in range(10 if preload else 0):
                    job_wide_dump(dumps)
                time.sleep(0.2)
                open(os.path.join(cwd, "stop"), "w").close()
            return wait_app(scenario, preload, ten_dumps, env={"NCCLWATCH_MAX_DUMPS": "50"}, timeout=120,
                            args=["8", work_us])

        got = same_as_without(run, "eintr_loop", None,
                              ["nanosleep returned EINTR 0 time(s) on the main thread, 0 on the 8 NCCL thread(s)"])
        dumps = [d for d in got.dumps().get(0, []) if d["summary"]["reason"] == "peer_request"]
        check(len(dumps) == 10, f"{work_us} us: ten job-wide dumps: {got.reasons(0)}\n{got.err[-2000:]}")
        pid = dumps[0]["summary"]["pid"]
        for d in dumps:
            app = [t for t in d["threads"] if not t["own"]]
            main = [t for t in app if t["tid"] == pid]
            # Each stack is whole (read from a copy taken while the thread waited, or by the
            # thread itself): it reaches the loop's function.
            loop = lambda t: any(f.get("symbol") == "work_sleep_loop" for f in t["frames"])
            check(main and loop(main[0]), f"{d['_path']}: the main thread's stack: {main}")
            nccl = [t for t in app if t["tid"] != pid and loop(t)]
            check(len(nccl) == 8,
                  f"{d['_path']}: the NCCL threads' stacks: {[(t['tid'], t['note'], t['frames']) for t in app]}")
            cut = [t["note"] for t in d["threads"] if "EINTR" in t.get("note", "")]
            check(not cut, f"{d['_path']}: no stack signal cut a system call short: {cut}")


@long_case(15)
def dump_signal_cuts_the_wait_it_lands_on():
    # `kill -USR2`, the on-demand trigger: the kernel gives it to the main thread, asleep in
    # sleep(4), which returns after 1 s with 2 or 3 s left (a handler ran: the kernel never
    # resumes a sleep then). The README says so; the dump and a line say which thread's call was
    # cut, and point to `ncclwatch dump`, which cuts nothing: the same sleep lasts 4 s, as without.
    def usr2(p, cwd, dumps):
        time.sleep(1)
        os.kill(rank_pid(p, 0), signal.SIGUSR2)

    j, ending = wait_app("sleep4", True, usr2)
    check(j.rc == 0 and not ending, f"the process goes on after SIGUSR2: {j.rc} {ending}\n{j.err[-1500:]}")
    check(re.search(r"sleep\(4\) left [123] after [12] s", j.out), f"the sleep was cut short, as the README says: {j.out!r}")
    d = j.first(0, "on_demand")
    pid = d["summary"]["pid"]
    said = f"SIGUSR2 landed on thread {pid} and cut its system call short (EINTR)"
    check(said in d["summary"]["detail"], f"the dump says which call was cut: {d['summary']['detail']!r}")
    check(any(said in l and "`ncclwatch dump` asks for a dump without a signal" in l for l in j.ncclwatch_lines()),
          f"a line says it and points to ncclwatch dump: {j.ncclwatch_lines()}")
    without, ending = wait_app("sleep4", False, usr2)
    check(ending and "killed by SIGUSR2" in ending[0], f"without ncclwatch SIGUSR2 ends the process: {ending}")

    def run(scenario, preload):
        def dump(p, cwd, dumps):
            time.sleep(1)
            if preload:
                job_wide_dump(dumps, wait=3)
        return wait_app(scenario, preload, dump)

    got = same_as_without(run, "sleep4", None, ["sleep(4) left 0 after 4 s"])
    check(got.reasons(0)[:1] == ["peer_request"], f"the job-wide dump was written: {got.reasons(0)}")


def fault_lines(out):
    return [l for l in out.splitlines() if l.startswith("write ")]


@serial_case
def handled_faults_are_no_crash():
    # A SIGSEGV handler set before NCCL (guard pages, a GC, a wasm runtime) unprotects the page
    # and the write goes on, five times: no fatal_signal dump, no wait on any fault, one line
    # "chained to the application's handler" (NCCLWATCH_LOG=info), and the process is not marked
    # as dumped at its end: when it is SIGKILLed next, its black box becomes its postmortem dump
    # (rank 0's exit converts it). Status and output as without the library.
    run = lambda preload: wait_app("guard_retry", preload, n=2, env={"NCCLWATCH_LOG": "info"}, timeout=30)
    without, ending_without = run(False)
    got, ending = run(True)
    check(ending_without == ["simlaunch: rank 1 killed by SIGKILL"], f"without: {ending_without}\n{without.err[-1500:]}")
    check(ending == ending_without and got.rc == without.rc, f"{ending} {got.rc} vs {ending_without} {without.rc}")
    check(got.out == without.out, f"output {got.out!r} with ncclwatch, {without.out!r} without")
    check("5 faults handled" in got.out and len(fault_lines(got.out)) == 5 and
          all("under 100 ms" in l for l in fault_lines(got.out)),
          f"five faults, none waited: {got.out!r}\n{[l for l in got.err.splitlines() if 'took' in l]}")
    reasons = got.reasons(1)
    check("fatal_signal" not in reasons, f"a handled fault is no crash: {reasons}")
    check("postmortem" in reasons, f"not marked as dumped at its end: its box became its postmortem: {reasons}\n"
                                   f"{got.err[-2000:]}")
    chained = [l for l in got.ncclwatch_lines() if "chained to the application's handler" in l]
    check(len(chained) == 1 and "SIGSEGV" in chained[0], f"said once: {got.ncclwatch_lines()}")


@serial_case
def fault_handler_giving_up_ends_with_its_dump():
    # The same handler fixes three faults, then gives up: it sets SIGSEGV's default action and
    # returns (the write faults again), or raises SIGSEGV itself. The process dies of SIGSEGV as
    # without the library, the three handled faults waited for nothing, and the end has its
    # fatal_signal dump, which says the application's handler ran first.
    for scenario in ("guard_give_up", "guard_raise"):
        got = same_as_without(lambda s, preload: wait_app(s, preload), scenario, "killed by SIGSEGV",
                              ["write 3: 3 fault(s) so far"])
        lines = fault_lines(got.out)
        check(len(lines) == 3 and all("under 100 ms" in l for l in lines), f"{scenario}: no wait: {got.out!r}")
        check(got.reasons(0) == ["fatal_signal"], f"{scenario}: one dump, of the end: {got.reasons(0)}")
        detail = got.first(0, "fatal_signal")["summary"]["detail"]
        check("the application's handler ran first" in detail, f"{scenario}: the dump says so: {detail!r}")
