"""What the library takes from the job: memory (its watchdog allocates nothing in steady state,
and an application out of memory keeps its own exit status, jemalloc preloaded or not),
descriptors (RLIMIT_NOFILE: none kept at a small limit, the last few always the application's)
and address space (RLIMIT_AS: small stacks, no arena of its own). Each case runs the same
program with and without the library and compares what it prints, how it ends, and says
whether the evidence was written or why not, in one line."""
import os
import re

from cases_harm import ready_then_dump, same_as_without
from e2e_common import built, case, long_case, job
from ncclwatch_testing import check, temp_dir

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def limits_app(args, preload, env=None, program="e2e_limits_app", dump=False):
    """Runs limits_app `args` as one rank; `dump`: a job-wide dump request once it says it waits."""
    cwd = temp_dir("ncclwatch-e2e-limits-")
    dumps = os.path.join(cwd, "dumps")
    j = job(1, list(args), env={"NCCLWATCH_TIMEOUT": "600", "NCCLWATCH_DIR": dumps,
                                "E2E_READY_FILE": os.path.join(cwd, "ready"), **(env or {})},
            timeout=60, preload=preload, program=program, cwd=cwd,
            after_start=ready_then_dump(cwd, dumps, preload) if dump else None)
    j.dir = dumps
    return j, [l for l in j.err.splitlines() if l.startswith("simlaunch: rank 0 ")]


def said(j, pattern):
    return [l for l in j.err.splitlines() if l.startswith("ncclwatch") and re.search(pattern, l)]


@long_case(14)
def watchdog_allocates_nothing_in_steady_state():
    # malloc interposed by the program: the thread named "ncclwatch" makes no allocation in 5.5 s
    # of operations without a stall (every poll, drain, deadline check, box keeping, request
    # poll, caretaker check, a metrics file written every 5 s): out of memory, an allocation may
    # crash (jemalloc) rather than fail.
    env = {"NCCLWATCH_PEER_POLL_MS": "50", "NCCLWATCH_POLL_MS": "20",
           "NCCLWATCH_METRICS": os.path.join(temp_dir("ncclwatch-e2e-metrics-"), "m")}
    j, ending = limits_app(["mallocs", "5500"], True, env=env, program="e2e_limits_count_app")
    check(j.rc == 0 and not ending, f"mallocs: {j.rc} {ending}\n{j.err[-3000:]}")
    check("the ncclwatch thread allocated 0 times" in j.out, f"no allocation on the watchdog thread: {j.out}\n{j.err[-6000:]}")
    print(f"  {j.out.splitlines()[-1]}")
    j, _ = limits_app(["mallocs"], False, program="e2e_limits_count_app")
    check("no ncclwatch thread" in j.out, f"without the library: {j.out}")


@long_case(40)
def out_of_memory_keeps_its_exit_status():
    # The application exhausts its address space (RLIMIT_AS) and exits 12, with glibc's malloc
    # and with jemalloc preloaded (which crashes where glibc returns NULL): the same status and
    # output, and the exit record is written or its absence said in one line.
    lib = built("lib", "libncclwatch.so")
    mallocs = [("glibc", None)]
    if os.path.exists(JEMALLOC):
        mallocs.append(("jemalloc", JEMALLOC))
    else:
        print(f"  {JEMALLOC} not installed (apt-get install libjemalloc2): jemalloc not tried")
    for name, pre in mallocs:
        def run(scenario, preload):
            env = {"NCCLWATCH_METRICS": os.path.join(temp_dir("ncclwatch-e2e-metrics-"), "m"),
                   "NCCLWATCH_PEER_POLL_MS": "50", "NCCLWATCH_POLL_MS": "20"}
            if pre:
                env["LD_PRELOAD"] = f"{pre}:{lib}" if preload else pre
            return limits_app([scenario], preload, env=env)
        # Out of memory after operations, and (jemalloc) before the first one: the watchdog's
        # first allocation, jemalloc's set-up of its thread, would come out of memory. (Under
        # glibc the simulator's own operation aborts there, with or without the library.)
        for scenario in ("oom_exit", "oom_early") if pre else ("oom_exit",):
            got = same_as_without(run, scenario, "exited with code 12", ["out of memory"])
            lines = said(got, r"exit.*no exit record: (the process is out of address space|the watchdog did not write it)")
            record = [f for f in (os.listdir(got.dir) if os.path.isdir(got.dir) else []) if f.endswith("-exit.json")]
            check(len(lines) == 1 or (record and not lines),
                  f"{name}: the exit record is written, or one line says why not: {record} {lines}\n{got.err[-2000:]}")
            print(f"  {name} {scenario}: exit 12 kept; {lines[0] if lines else 'exit record written'}")


@case
def descriptors_left_to_the_application():
    # RLIMIT_NOFILE 16 and 4: the application opens as many files as without the library, and
    # its communicator starts (none is kept open at a limit this small; one line says so at info).
    run = lambda scenario, preload, limit=None: limits_app(["nofile", limit], preload)
    for limit in ("16", "4"):
        got = same_as_without(lambda s, p: run(s, p, limit), "nofile", None, ["started", "operations failed: 0"])
        print(f"  RLIMIT_NOFILE {limit}: {got.out.splitlines()[1]}")


@long_case(18)
def last_descriptors_stay_the_applications():
    # All descriptors but one in use while a job-wide dump is asked: none of the application's
    # opens (a loop of open and close all the while) fails (no dump is written: one line says so); with every one in use, the
    # request is not answered, and one line says so.
    run = lambda scenario, preload, keep=None: limits_app(["nofile_free", keep], preload, dump=True)
    got = same_as_without(lambda s, p: run(s, p, "1"), "nofile_free", None, ["held all but 1; 0 opens failed"])
    lines = said(got, r"descriptor")
    check(got.dumps() or lines, f"one free: a dump, or a line that says why not: {got.err[-2000:]}")
    print(f"  one free: {lines[:1] or 'dumped'}")
    got = same_as_without(lambda s, p: run(s, p, "0"), "nofile_free", None, ["held all but 0; 0 opens failed"])
    lines = said(got, r"job-wide dump request .* not answered")
    check(len(lines) == 1, f"none free: one line says the request is not answered: {got.err[-2000:]}")
    print(f"  none free: {lines[0]}")


@case
def address_space_left_to_the_application():
    # RLIMIT_AS at the process's size + 24 MiB before NCCL starts: its operations and 8 MiB of its
    # own allocations succeed as without the library (the watchdog's stack is small: 8 MiB by
    # default); the exit record is written, or one line says why not.
    run = lambda scenario, preload: limits_app([scenario], preload, env={"LIMITS_AS_MIB": "24"})
    got = same_as_without(run, "as_tight", None, ["operations failed: 0; 1 MiB allocations: 8 of 8"])
    record = [f for f in (os.listdir(got.dir) if os.path.isdir(got.dir) else []) if f.endswith("-exit.json")]
    lines = said(got, r"no exit record")
    check((record and not lines) or len(lines) == 1, f"the exit record, or one line: {record} {lines}")
    # What the library adds to the address space after 3 s of operations, against the same
    # program without it.
    grown = {}
    for preload in (False, True):
        j, _ = limits_app(["vm"], preload)
        m = re.search(r"vm: VmSize \d+ -> (\d+) KiB \(\+(\d+)\), VmPeak \d+ -> (\d+) KiB", j.err)
        check(m, f"vm: {j.err[-1500:]}")
        grown[preload] = (int(m.group(1)), int(m.group(3)))
    added = (grown[True][0] - grown[False][0]) // 1024
    print(f"  VmSize with the library: +{added} MiB, VmPeak +{(grown[True][1] - grown[False][1]) // 1024} MiB")
    # glibc gives the watchdog thread an arena (64 MiB reserved, set up when the thread starts, so
    # never after the application set a limit); the rest (the library, its thread's stack: 8 MiB
    # by default) stays under 8 MiB.
    check(added < 64 + 8, f"the library adds its thread's arena and less than 8 MiB: +{added} MiB")
