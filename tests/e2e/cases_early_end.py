"""A rank that ends or stops in its first moments, and what a killed job leaves on its host:
the black box knows what was issued and completed from the first call, a stop is seen whatever
the process's age, and the relay directory is left as it was found."""
import glob
import json
import os
import re
import signal
import subprocess
import time

from e2e_common import (analyze_dir, built, case, host_dirs, job)
from ncclwatch_testing import (all_of, check, child_pids, dumped, temp_dir, wait_for)

# What a report must never say of a rank whose last call was #20: its first call, or that
# nothing of what its GPU did is known.
WRONG = re.compile(r"#1\b(?!\d)|never polled|finished #1 ")


def culprit_where(j, cause):
    rc, report = analyze_dir(j.dir)
    v = report["verdicts"][0] if report["verdicts"] else {}
    what = json.dumps(report["verdicts"], indent=1)[:2500]
    check(v.get("cause") == cause and v.get("culprit_ranks") == [1], f"{cause} [1] (exit {rc}):\n{what}\n{j.err[-1500:]}")
    return v.get("culprit_stacks", {}).get("1", {}).get("where", "")


@case
def early_end_first_second_is_told():
    # Rank 1 ends itself after its 20th all-reduce, well within its first second: SIGKILLed (the
    # OOM killer's way) or SIGSTOPped (a debugger, Ctrl-Z; the launcher's timeout kills it
    # stopped). Its box knows its 20 calls and what its GPU completed of them; the report names
    # its last call, never #1 or "never polled"; the stopped one is stopped, not "SIGKILL or the
    # OOM killer".
    for how in ("--kill-self", "--stop-self"):
        # On a loaded machine the watchdog thread may not have run at all in the milliseconds the
        # rank lived: a box without op states is tried once more (it says so; never a wrong text).
        for attempt in range(2):
            j = job(4, ["--iters", "200", "--exit-rank", "1", "--exit-at", "20", how],
                    env={"NCCLWATCH_TIMEOUT": "2"}, timeout=8,
                    until=lambda d: all_of(dumped(d, [0, 2, 3], ["stall"]), dumped(d, [1], ["postmortem", "stopped"])))
            boxed = [d for d in j.dumps().get(1, []) if d["summary"]["reason"] in ("postmortem", "stopped")]
            if boxed and all(d["summary"].get("states_as_of_mono_ns", 0) > 0 for d in boxed):
                break
        stopped = how == "--stop-self"
        where = culprit_where(j, "rank_stopped" if stopped else "rank_dead")
        check("#20" in where and not WRONG.search(where), f"{how}: its last call #20, nothing false: {where}")
        if stopped:
            check("stopped (SIGSTOP" in where and "OOM" not in where, f"{how}: seen stopped: {where}")
        post = [d for d in j.dumps().get(1, []) if d["summary"]["reason"] in ("postmortem", "stopped")]
        check(post, f"{how}: rank 1's box became a dump: {j.reasons(1)}\n{j.err[-1500:]}")
        for d in post:
            check(d["summary"].get("states_as_of_mono_ns", 0) > 0, f"{how}: its box has op states ({d['_path']})")


def box_dirs_empty(boxes_dir, relay_dir, what):
    # The caretaker's lock (one file per user, whoever is elected next uses it) is all that stays.
    left = sorted(os.listdir(relay_dir)) + [f for f in sorted(os.listdir(boxes_dir)) if "caretaker" not in f]
    check(not left, f"{what}: the host is left as it was found: {left}")


@case
def early_end_killed_job_leaves_nothing():
    # A job is SIGKILLed whole a second into its run (its relay written: a job-wide request was
    # relayed), under `ncclwatch run` and without; a short job runs right after on the host. The
    # black box and relay directories are then as they were before (the caretaker's lock aside),
    # with no wait for leftovers to age.
    nw = built("bin", "ncclwatch")
    for under_run in (False, True):
        boxes_dir, relay_dir, host = host_dirs()
        what = "under ncclwatch run" if under_run else "without it"
        tmp = temp_dir("ncclwatch-e2e-")
        dumps = os.path.join(tmp, "dumps")
        env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
        env.update(host, NCCLWATCH_PEER_POLL_MS="100", NCCLWATCH_TIMEOUT="1")
        job_cmd = [built("bin", "simlaunch"), "-n", "3", "--timeout", "20", "--", built("bin", "sim_workload"),
                   "--iters", "100000", "--busy-rank", "2", "--busy-at", "5", "--busy-ms", "-1"]
        if under_run:
            cmd = [nw, "run", "--dir", dumps, "--"] + job_cmd
        else:
            cmd = job_cmd
            env.update(NCCLWATCH_DIR=dumps, LD_PRELOAD=built("lib", "libncclwatch.so"))
        p = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # The launcher: the job's command, or `ncclwatch run`'s child.
            launcher = wait_for(lambda: child_pids(p.pid), "the launcher")[0] if under_run else p.pid
            pids = wait_for(lambda: len(child_pids(launcher)) == 3 and child_pids(launcher), f"{what}: 3 ranks")
            wait_for(lambda: glob.glob(os.path.join(relay_dir, "ncclwatch-relay-*")), f"{what}: the relay")
            wait_for(lambda: len(glob.glob(os.path.join(dumps, "rank*-peer_request.json"))) >= 2,
                     f"{what}: the relayed request's dumps")
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        # The next job on the host, right away and short (its ranks start while it looks).
        second = job(2, ["--iters", "3"], env=host, timeout=15)
        check(second.rc == 0, f"{what}: the second job ran: {second.err[-1500:]}")
        box_dirs_empty(boxes_dir, relay_dir, what)
        ranks = {json.load(open(f))["summary"]["rank"] for f in glob.glob(os.path.join(dumps, "rank*-postmortem.json"))}
        check(ranks == {0, 1, 2}, f"{what}: every killed rank has its postmortem dump ({sorted(ranks)})\n{err[-1500:]}")
