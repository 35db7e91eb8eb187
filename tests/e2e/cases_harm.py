"""Never harm the job: a process that never calls NCCL sees nothing of us, and an
application's own signals, waits, descriptors and files behave as they do without the library."""
import json
import os
import stat
import subprocess
import time

from e2e_common import (analyze_dir, built, case, long_case, job, kill_after_stall, only_exit_records, signal_app)
from ncclwatch_testing import (all_of, check, dumped, temp_dir)


@case
def healthy_run_leaves_only_exit_records():
    j = job(4, ["--iters", "200", "--comms", "2"])
    check(j.rc == 0, f"job failed ({j.rc}): {j.err[-2000:]}")
    check(j.out.count("ok") == 4, "every rank prints ok")
    # One small exit record per rank (where it stopped, for ranks that might wait on it) and
    # nothing else; nothing said on stderr.
    files = sorted(os.listdir(j.dir))
    check(len(files) == 4 and all(f.endswith("-exit.json") for f in files), f"one exit record per rank: {files}")
    for f in files:
        path = os.path.join(j.dir, f)
        check(os.path.getsize(path) < 64 * 1024, f"{f} is small: {os.path.getsize(path)} bytes")
        with open(path) as fh:
            d = json.load(fh)
        s = d["summary"]
        check(s["reason"] == "exit" and s["exit_status"] == 0 and not s["in_flight"], f"{f}: a clean exit: {s['reason']}")
        # Written by the exiting thread itself: its stack starts where the application exits,
        # not in ncclwatch's own dump code.
        top = [t["frames"][0] for t in d["threads"] if t["name"] == "exiting thread" and t["frames"]]
        module = d["modules"][top[0]["module"]] if top else {}  # version 2: frames name a module by index
        check(top and not module["path"].endswith("libncclwatch.so") and module["build_id"],
              f"{f}: the exiting thread's stack starts outside ncclwatch: {top[:1]}")
        check(all(c["last_completed"] == c["last_enqueued"] for c in s["comms"]), f"{f}: everything completed")
    check(not j.ncclwatch_lines(), f"no output from ncclwatch: {j.ncclwatch_lines()}")
    rc, report = analyze_dir(j.dir)
    check(rc == 0 and report["verdicts"][0]["cause"] == "no_hang", f"analyze: no_hang, exit 0 ({rc})")
    j = job(2, ["--iters", "20"], env={"NCCLWATCH_EXIT_RECORD": "0"})
    check(j.rc == 0 and not os.path.exists(j.dir), "NCCLWATCH_EXIT_RECORD=0: no file at all")


@case
def non_nccl_process_untouched():
    lib = built("lib", "libncclwatch.so")
    probe = ["python3", "-c", "import os,threading; print(len(os.listdir('/proc/self/task')), sorted(os.listdir('.')))"]
    for preload in (False, True):
        cwd = temp_dir("ncclwatch-e2e-")
        env = dict(os.environ, LD_PRELOAD=lib) if preload else dict(os.environ)
        r = subprocess.run(probe, env=env, cwd=cwd, capture_output=True, text=True)
        if not preload:
            baseline = r
        else:
            check(r.returncode == 0 and r.stdout == baseline.stdout, f"same threads and files: {r.stdout!r} vs {baseline.stdout!r}")
            check(r.stderr == "", f"no output: {r.stderr!r}")
            t = subprocess.run(["/bin/true"], env=env, cwd=cwd, capture_output=True, text=True)
            check(t.returncode == 0 and t.stdout == "" and t.stderr == "", "/bin/true untouched")
            check(os.listdir(cwd) == [], "no file written")


@case
def version_only_starts_nothing():
    lib = built("lib", "libncclwatch.so")
    exe = built("bin", "e2e_version_only")
    dirs = [built("sim")]
    for real in ("/usr/local/cuda/lib64", "/usr/local/cuda/lib"):
        if os.path.exists(os.path.join(real, "libnccl.so.2")):
            dirs.append(real)  # the real NCCL, where the toolkit is installed
            break
    for libdir in dirs:
        cwd = temp_dir("ncclwatch-e2e-")
        env = dict(os.environ, LD_PRELOAD=lib, LD_LIBRARY_PATH=libdir)
        r = subprocess.run([exe], env=env, cwd=cwd, capture_output=True, text=True)
        check(r.returncode == 0, f"{libdir}: ncclGetVersion works through the library: {r.stdout} {r.stderr}")
        fields = r.stdout.split()
        check(int(fields[1]) >= 21800, f"{libdir}: a version >= 2.18 ({r.stdout})")
        check(fields[5] == "1", f"{libdir}: one thread only, no watchdog ({r.stdout})")
        check(fields[7] == "0" and os.listdir(cwd) == [], f"{libdir}: no file ({r.stdout})")
        check(r.stderr == "", f"{libdir}: no output ({r.stderr!r})")
        print(f"  {libdir}: {r.stdout.strip()}")


@case
def disable_is_pass_through():
    j = job(3, ["--iters", "8", "--busy-rank", "0", "--busy-at", "3", "--busy-ms", "2500"],
            env={"NCCLWATCH_DISABLE": "1", "NCCLWATCH_TIMEOUT": "1"})
    check(j.rc == 0, f"job ok: {j.err[-2000:]}")
    check(not os.path.exists(j.dir), "no dump when disabled")
    check(not j.ncclwatch_lines(), "no output when disabled")


@case
def sigterm_chains_to_app_handler():
    j = job(2, ["--iters", "20", "--busy-rank", "0", "--busy-at", "5", "--busy-ms", "-1", "--sigterm-handler"],
            env={"NCCLWATCH_TIMEOUT": "600"}, timeout=4)
    check(j.out.count("app handler ran") == 2, f"the application's handler ran on both ranks: {j.out}")
    check(j.err.count("code 42") == 2, f"and its exit status was kept:\n{j.err[-1500:]}")
    for r in range(2):
        j.first(r, "signal")


@case
def signals_chained_as_without_ncclwatch():
    # The application's own dispositions, set before NCCL starts: each run ends exactly as the
    # same program without the library (the kernel's rules: SA_RESETHAND runs a handler once, a
    # fault is never ignored, an ignored signal stays ignored in the process and its children).
    want_end = {"resethand_segv": "killed by SIGSEGV", "ignored_segv": "killed by SIGSEGV",
                "resethand_term": "killed by SIGTERM", "ignored_term": None,  # None: exit 0, no line
                "term_then_segv": "killed by SIGTERM", "forked_child_usr2": None}
    # The dumps these check are written while a handler waits: on a loaded 2-core machine (two
    # busy loops, the e2e cases side by side) a signal dump took over the default 5 s once, so
    # the wait here is 12 s (below the program's own 15 s alarm).
    run = lambda scenario, preload: signal_app(scenario, preload, env={"NCCLWATCH_SIGNAL_WAIT_MS": "12000"})
    for scenario, end in want_end.items():
        got = same_as_without(run, scenario, end, must_say=("started",))  # it reached NCCL
        reasons = got.reasons(0)
        if scenario == "resethand_term":  # the first SIGTERM is dumped, then handled once
            check(reasons[:1] == ["signal"], f"{scenario}: a signal dump first: {reasons}")
            check(got.out.count("term handler ran") == 1, got.out)
        elif scenario == "resethand_segv":
            check(reasons[:1] == ["fatal_signal"], f"{scenario}: the crash is dumped: {reasons}")
            check(got.out.count("segv handler ran") == 1, got.out)
        elif scenario == "term_then_segv":  # the first leads: its dump, its status
            check(reasons[:1] == ["signal"], f"{scenario}: the SIGTERM is dumped: {reasons}")
        elif scenario == "forked_child_usr2":  # the child (not ncclwatch's) dies of it at once
            check("child killed by signal 12" in got.out, f"{scenario}: {got.out!r}")
        elif scenario == "ignored_term":  # no handler, no dump: only the exit record
            check(reasons == ["exit"], f"{scenario}: an ignored signal writes nothing: {reasons}")
            ignored = [l.split()[-1] for l in got.out.splitlines() if "SigIgn" in l]
            check(len(ignored) == 2 and all(int(m, 16) & 0x4002 == 0x4002 for m in ignored),
                  f"{scenario}: SIGINT and SIGTERM still ignored in the process and its child: {got.out!r}")


def same_as_without(run, scenario, end, must_say=()):
    """Runs `scenario` without and with the library (run(scenario, preload) -> (Job, ending lines)):
    the same exit status, ending signal and output; `end` is the ending line's tail (None: exit 0)."""
    without, ending_without = run(scenario, False)
    got, ending = run(scenario, True)
    if end is None:
        check(without.rc == 0 and not ending_without, f"{scenario} without ncclwatch: {without.rc} {ending_without}")
    else:
        check(ending_without and end in ending_without[0], f"{scenario} without ncclwatch: {ending_without}\n{without.out}")
    check(ending == ending_without and got.rc == without.rc,
          f"{scenario}: {got.rc} {ending} with ncclwatch, {without.rc} {ending_without} without:\n{got.err[-1500:]}")
    check(got.out == without.out, f"{scenario}: output {got.out!r} with ncclwatch, {without.out!r} without")
    for line in must_say:
        check(line in got.out, f"{scenario}: says {line!r}: {got.out!r}")
    check("terminate called" not in got.err, f"{scenario}: an exception reached the application:\n{got.err[-1500:]}")
    return got


@case
def signals_as_the_kernel_delivers_them():
    # The kernel's rules, each against the same program without the library: a signal sent to
    # the process goes to a thread that does not block it (or stays pending while all do), also
    # once the main thread has exited; an application's handler runs with its own flags (no
    # SA_RESTART, no SA_ONSTACK it did not ask for) and mask, may leave with longjmp, and may call
    # exit() while the interrupted thread holds malloc's lock.
    run = lambda scenario, preload: signal_app(scenario, preload)
    got = same_as_without(run, "blocked_abrt", "killed by SIGABRT", ["worker unblocks SIGABRT"])
    check(got.reasons(0)[:1] == ["fatal_signal"], f"blocked_abrt: the SIGABRT is dumped: {got.reasons(0)}")
    same_as_without(run, "main_exited_abrt", "killed by SIGABRT", ["worker unblocks SIGABRT"])
    got = same_as_without(run, "term_no_restart", None, ["read returned -1 (EINTR), handler ran: 1"])
    check(got.reasons(0)[:1] == ["signal"], f"term_no_restart: the SIGTERM is dumped: {got.reasons(0)}")
    same_as_without(run, "longjmp_int", "killed by SIGTERM", ["after the jump: SIGINT blocked 1, SIGTERM blocked 0"])
    same_as_without(run, "exit_in_handler", "exited with code 5")
    same_as_without(run, "term_no_onstack", None, ["term handler on the thread's stack", "term handler returned"])


def ready_then_dump(cwd, dumps, preload=True):
    """after_start: once the program says it waits (a file "ready" in its directory), a
    job-wide dump request, as `ncclwatch dump` makes it. Its wait for answers ends with the job
    (no rank answers after it); without the library there is nobody to answer, and no request
    (the program cannot tell either way)."""
    def after(p):
        for _ in range(600):
            if os.path.exists(os.path.join(cwd, "ready")) or p.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(0.3)
        if not preload:
            return
        with subprocess.Popen([built("bin", "ncclwatch"), "dump", dumps, "--wait", "10"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as asked:
            while asked.poll() is None and p.poll() is None:
                time.sleep(0.05)
            if asked.poll() is None:
                asked.kill()
    return after


def app_with_dump(program, scenario, preload, env=None):
    cwd = temp_dir("ncclwatch-e2e-app-")
    dumps = os.path.join(cwd, "dumps")
    j = job(1, [scenario], env={"NCCLWATCH_TIMEOUT": "600", "NCCLWATCH_DIR": dumps,
                                "E2E_READY_FILE": os.path.join(cwd, "ready"), **(env or {})}, timeout=30,
            preload=preload, program=program, cwd=cwd, after_start=ready_then_dump(cwd, dumps, preload))
    j.dir = dumps
    return j, [l for l in j.err.splitlines() if l.startswith("simlaunch: rank 0 ")]


@case
def dump_keeps_waits_whole():
    # A job-wide dump samples the stacks of the main thread (in sleep) and of a thread that
    # called NCCL (in sem_timedwait, then nanosleep): threads blocked in a system call are
    # sampled without a signal, so each wait keeps its length and result, as without the library.
    run = lambda scenario, preload: app_with_dump("e2e_signal_app", scenario, preload)
    got = same_as_without(run, "waits_in_full", None,
                          ["main: sleep(4) left 0 after 4 s", "sem_timedwait -1 Connection timed out after 3 s"])
    d = got.first(0, "peer_request")
    main = [t for t in d["threads"] if t["tid"] == d["summary"]["pid"]]
    check(main and main[0]["frames"], f"the main thread's stack is sampled: {main}")
    others = [t for t in d["threads"] if not t["own"] and t["tid"] != d["summary"]["pid"] and t["frames"]]
    check(others, f"the waiting NCCL thread's stack is sampled: {[(t['tid'], t['note']) for t in d['threads']]}")


@long_case(14)
def resources_as_without_ncclwatch():
    # No descriptor, mapping or exception of ours reaches the application: a process that never
    # starts ncclwatch has no descriptor and no library more; one that closed every descriptor
    # at start finds its own files untouched by a dump; one that runs out of memory exits with
    # its own status, whatever of ours could not allocate.
    plain = lambda scenario, preload: (lambda j: (j, [l for l in j.err.splitlines() if l.startswith("simlaunch: rank 0 ")]))(
        job(1, [scenario], env={"NCCLWATCH_TIMEOUT": "600"}, timeout=60, preload=preload, program="e2e_resource_app"))
    for scenario in ("never_nccl", "unique_id_only"):
        same_as_without(plain, scenario, None, [f"{scenario}: libunwind mapped 0, liblzma mapped 0"])
    run = lambda scenario, preload: app_with_dump("e2e_resource_app", scenario, preload)
    got = same_as_without(run, "closed_fds", None, ["a.txt: 10 bytes, as written, offset 10",
                                                    "b.txt: 10 bytes, as written, offset 10"])
    check(got.reasons(0)[:1] == ["peer_request"], f"closed_fds: the dump was written: {got.reasons(0)}")
    same_as_without(plain, "oom_exit", "exited with code 12", ["out of memory"])


@case
def stderr_that_is_not_ours_gets_nothing():
    # Descriptor 2 closed and taken by the application's data file: a line at the first NCCL call
    # (an unknown NCCLWATCH_ variable) and a job-wide dump's lines never land in it. Stderr a pipe
    # nobody reads: the same line, written on the application's thread, raises no SIGPIPE. Both
    # end, print and exit as without the library.
    env = {"NCCLWATCH_NOT_A_SETTING": "1", "NCCLWATCH_LOG": "info"}
    run = lambda scenario, preload: app_with_dump("e2e_resource_app", scenario, preload, env=env)
    got = same_as_without(run, "stderr_reused", None, ["data.txt (descriptor 2): 10 bytes, as written, offset 10"])
    check(got.reasons(0)[:1] == ["peer_request"], f"stderr_reused: the dump was written: {got.reasons(0)}")
    plain = lambda scenario, preload: (lambda j: (j, [l for l in j.err.splitlines() if l.startswith("simlaunch: rank 0 ")]))(
        job(1, [scenario], env={"NCCLWATCH_TIMEOUT": "600", **env}, timeout=60, preload=preload,
            program="e2e_resource_app"))
    same_as_without(plain, "stderr_dead_pipe", None, ["stderr_dead_pipe: ran 20 operations and lived"])


@long_case(16)
def descriptors_closed_after_start_stay_the_applications():
    # An application that closes every descriptor >= 3 once NCCL has started (the library's
    # locks among them) and opens files of its own, which take the freed numbers: a burst of
    # operations (the watchdog woken from the application's thread), a stall and its recovery,
    # a job-wide dump and the exit leave its files exactly as written, before and after the
    # library's exit handler, as without the library; and the live process is no dead one.
    env = {"NCCLWATCH_TIMEOUT": "1", "NCCLWATCH_SIM_FAULT": "kernel:rank=0,seq=3011,ms=2500", "NCCLWATCH_LOG": "info"}
    run = lambda scenario, preload: app_with_dump("e2e_resource_app", scenario, preload, env=env)
    got = same_as_without(run, "closed_after_init", None, [f"own{i}.txt: 10 bytes, as written, offset 10" for i in range(8)])
    check(got.out.count("as written") == 16 and "changed" not in got.out, f"every file, both times: {got.out!r}")
    reasons = got.reasons(0)
    check(all(r in reasons for r in ("stall", "recovery", "peer_request")) and reasons[-1] == "exit",
          f"the stall, its recovery, the job-wide dump and the exit were written: {reasons}")
    check("no longer ours" in got.err, f"the lost descriptors are said:\n{got.err[-2000:]}")
    check("without a word" not in got.err and "postmortem" not in reasons, f"no death is told:\n{got.err[-2000:]}")


@case
def dump_leaves_other_threads_sleeping():
    # An on-demand dump signals only the threads whose native stacks a report shows (the main
    # thread, the threads that call NCCL): a thread that never calls NCCL sleeps in full.
    j, ending = signal_app("sleeper", preload=True)
    check("sleeper slept in full" in j.out, f"the sleeper's sleep was not cut short: {j.out!r}")
    d = j.first(0, "on_demand")
    notes = [t["note"] for t in d["threads"] if not t["own"] and t["tid"] != d["summary"]["pid"]]
    check(any("not sampled" in n for n in notes), f"the sleeper is listed, not sampled: {notes}")
    main = [t for t in d["threads"] if t["tid"] == d["summary"]["pid"]]
    check(main and main[0]["frames"], f"the main thread's stack is sampled: {main}")


@case
def graph_capture_untouched():
    j = job(4, ["--graph", "--iters", "30"], timeout=30)
    check(j.rc == 0 and j.out.count("ok") == 4, f"capture and replay work with ncclwatch loaded: {j.err[-2000:]}")
    # The captured all-reduce counts as reached and completed: replays launch it.
    for s in only_exit_records(j, "nothing to dump"):
        check(all(c["last_completed"] == c["last_enqueued"] for c in s["comms"]), f"captured ops completed: {s['comms']}")


@case
def shared_dir_other_users_cannot_jam():
    # A node-local directory every user can write to (/dev/shm's mode, 1777): another user's
    # files under the names ncclwatch would use there (the caretaker's lock as a link, a relay's
    # temporary name) change nothing: ncclwatch keeps its files in its own 0700 subdirectory, and
    # a rank SIGKILLed still gets its postmortem. That subdirectory taken by another user: one
    # line, the job goes on without it, and ends as without ncclwatch.
    other = 65534
    uid = os.getuid()
    if uid != 0:
        return  # files of another user can only be made by root
    shared = temp_dir("ncclwatch-e2e-shared-")
    os.chmod(shared, 0o1777)
    # The caretaker's lock is one per user and namespaces (mount, PID).
    lock = f"ncclwatch-caretaker-{uid}-{os.stat('/proc/self/ns/mnt').st_ino}-{os.stat('/proc/self/ns/pid').st_ino}.lock"
    os.symlink("/etc/passwd", os.path.join(shared, lock))
    os.lchown(os.path.join(shared, lock), other, other)
    for name in (f"ncclwatch-relay-{uid}-0000000000000000.lock.tmp", f"ncclwatch-box-{uid}-1-x"):
        with open(os.path.join(shared, name), "w") as f:
            f.write("someone else's\n")
        os.chown(os.path.join(shared, name), other, other)
    env = {"NCCLWATCH_TIMEOUT": "2", "NCCLWATCH_BLACKBOX_DIR": shared, "NCCLWATCH_RELAY_DIR": shared}

    j = job(2, ["--iters", "200", "--busy-rank", "1", "--busy-at", "20", "--busy-ms", "-1"], env=env, timeout=15,
            after_start=lambda p: kill_after_stall(p, 1),
            until=lambda d: all_of(dumped(d, [0]), dumped(d, [1], ["postmortem"])))
    check("postmortem" in j.reasons(1), f"rank 1's postmortem despite the squatter: {j.reasons(1)}\n{j.err[-1500:]}")
    mine = os.path.join(shared, f"ncclwatch-{uid}")
    st = os.lstat(mine)
    check(stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, f"{mine}: {oct(st.st_mode)}")
    check(os.path.islink(os.path.join(shared, lock)), "the other user's link untouched")

    # The subdirectory itself taken by another user: refused, said once per rank, job unharmed.
    taken = temp_dir("ncclwatch-e2e-shared-")
    os.chmod(taken, 0o1777)
    os.mkdir(os.path.join(taken, f"ncclwatch-{uid}"), 0o777)
    os.chown(os.path.join(taken, f"ncclwatch-{uid}"), other, other)
    runs = {}
    for preload in (False, True):
        runs[preload] = job(2, ["--iters", "20"], env={"NCCLWATCH_TIMEOUT": "600", "NCCLWATCH_BLACKBOX_DIR": taken,
                                                      "NCCLWATCH_RELAY_DIR": taken}, timeout=30, preload=preload)
    got, without = runs[True], runs[False]
    check(got.rc == without.rc == 0 and got.out == without.out, f"as without ncclwatch: {got.rc} {without.rc}\n{got.err[-1500:]}")
    lines = [l for l in got.ncclwatch_lines() if f"belongs to user {other}" in l]
    check(len(lines) == 4, f"one line per rank and directory names the other user: {got.ncclwatch_lines()}")
    check(os.listdir(os.path.join(taken, f"ncclwatch-{uid}")) == [], "nothing written into the other user's directory")
