"""The framework's abort after ncclwatch's verdict (issue 42, item 1): a job hangs on a busy
rank, ncclwatch names it, then the job's own watchdog (PyTorch's) aborts every communicator
(ncclCommAbort) and ends the process: exit(6), or abort() (SIGABRT). The abort releases the
waiting operations' GPU work, which then ends: those operations are `aborted`, never completed or
recovered; the processes were ended by their framework after the wait, never culprits, never
`rank_dead`; the verdict given while the job hung stays the only one."""
import json
import os
import subprocess

from e2e_common import (built, case, long_case, dumps_by_rank, ring_entries, run_ended_when)
from ncclwatch_testing import (all_of, check, dumped, temp_dir)

BUSY, WAITING, SEQ = 3, [0, 1, 2], 21


def run_under_ncclwatch(workload, timeout_s, launcher_s, busy_ms=-1):
    """`ncclwatch run --timeout T` around 4 ranks of sim_workload, rank 3 busy for good from
    #21 (or for `busy_ms`); the launcher ends it (SIGTERM) after `launcher_s`. Returns
    (the command's result, the dump directory)."""
    tmp = temp_dir("ncclwatch-e2e-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCLWATCH_") and k != "LD_PRELOAD"}
    base["NCCLWATCH_BLACKBOX_DIR"] = os.path.join(tmp, "boxes")
    os.makedirs(base["NCCLWATCH_BLACKBOX_DIR"])
    dumps = os.path.join(tmp, "dumps")
    cmd = [built("bin", "ncclwatch"), "run", "--dir", dumps, "--timeout", str(timeout_s), "--set", "PEER_POLL_MS=200",
           "--", built("bin", "simlaunch"), "-n", "4", "--timeout", str(launcher_s), "--", built("bin", "sim_workload"),
           "--iters", "40", "--busy-rank", str(BUSY), "--busy-at", str(SEQ - 1), "--busy-ms", str(busy_ms)] + workload
    if busy_ms >= 0:  # every rank ends by itself
        r = subprocess.run(cmd, env=base, cwd=tmp, capture_output=True, text=True, timeout=launcher_s + 120)
    else:  # the busy rank stays: its time limit ends once the others ended and it answered their request
        ended = all_of(dumped(dumps, WAITING, ["fatal_signal", "exit"]), dumped(dumps, [BUSY], ["peer_request"]))
        r = run_ended_when(cmd, base, tmp, lambda out, err: ended(), timeout=launcher_s + 120)
    return r, dumps


def check_the_ending(r, dumps, how, what):
    """What must hold whatever the timing: the job's own dumps, the final report (JSON and the
    text `ncclwatch run` printed last)."""
    out = r.stdout + r.stderr
    by_rank = dumps_by_rank(dumps)
    reasons = {k: [d["summary"]["reason"] for d in v] for k, v in by_rank.items()}
    for w in WAITING:
        check("abort" in reasons.get(w, []), f"{what}: rank {w} aborted its communicator: {reasons}\n{out[-3000:]}")
    # The operations the abort released are not completed: no recovery, no completion counted.
    check(not any("recovery" in v for v in reasons.values()), f"{what}: no recovery dump for an aborted op: {reasons}")
    aborted_seen = 0
    for w in WAITING:
        after_abort = False
        for d in by_rank[w]:
            after_abort = after_abort or d["summary"]["reason"] == "abort"
            comm = d["summary"]["comms"][0]
            check(comm["last_completed"] < SEQ,
                  f"{what}: rank {w}'s {os.path.basename(d['_path'])}: last_completed {comm['last_completed']} (#{SEQ} never completed)")
            for op in ring_entries(d):
                if op["seq"] >= SEQ:
                    check(op["state"] != "completed", f"{what}: rank {w}'s {os.path.basename(d['_path'])}: #{op['seq']} {op['state']}")
                    aborted_seen += op["state"] == "aborted"
            if after_abort and d["summary"]["reason"] != "abort":
                check(comm["state"] == "aborted", f"{what}: rank {w}'s {os.path.basename(d['_path'])}: comm {comm['state']}")
    r2 = subprocess.run([built("bin", "ncclwatch"), "analyze", "--json", dumps], capture_output=True, text=True)
    report = json.loads(r2.stdout)
    verdicts = [(v["cause"], v["culprit_ranks"], v.get("seq")) for v in report["verdicts"]]
    check(r2.returncode == 1 and verdicts == [("rank_missing", [BUSY], SEQ)],
          f"{what}: rank {BUSY} missing from #{SEQ}, the only verdict ({r2.returncode}): {verdicts}\n"
          f"{json.dumps(report['verdicts'], indent=1)[:3000]}\n{out[-3000:]}")
    v = report["verdicts"][0]
    check(v["waiting_ranks"] == WAITING, f"{what}: ranks {WAITING} waited: {v['waiting_ranks']}")
    ended = {e["rank"]: e for e in v.get("ended_by_framework", [])}
    check(sorted(ended) == WAITING and all(how in e["how"] for e in ended.values()),
          f"{what}: ranks {WAITING} ended by their framework after the wait ({how}): {v.get('ended_by_framework')}")
    # What the user reads last: the last report `ncclwatch run` printed (the final one, or the
    # live one when the story did not change since, then the lines that tell its end).
    final = r.stdout[r.stdout.rfind("ncclwatch analyze:"):]
    if "no change since the report above" in r.stderr:
        final += r.stderr[r.stderr.rfind("no change since the report above"):]
    check("rank_missing" in final and "rank_dead" not in final and "no_hang" not in final and "no hang" not in final,
          f"{what}: the final report keeps the verdict:\n{final[-4000:]}")
    check("ended by their framework after the wait" in final and how in final,
          f"{what}: the final report tells the ending:\n{final[-4000:]}")
    return by_rank, aborted_seen


@case
def framework_abort_then_exit():
    # The case: the verdict at the deadline (3 s), the workload's watchdog at 6 s aborts
    # and exits with status 6. The exit settles the released operations: they are `aborted`.
    r, dumps = run_under_ncclwatch(["--abort-after-ms", "6000"], 3, 15)
    _, aborted = check_the_ending(r, dumps, "exit status 6", "abort, exit(6)")
    check(aborted > 0, "the released operations are recorded as aborted")


@case
def framework_abort_then_sigabrt():
    # As PyTorch's watchdog: ncclCommAbort, then abort() (SIGABRT).
    r, dumps = run_under_ncclwatch(["--abort-after-ms", "6000", "--abort-signal"], 3, 15)
    check_the_ending(r, dumps, "SIGABRT", "abort, SIGABRT")


@long_case(17)
def framework_abort_long_after_the_verdict():
    # PyTorch aborts 10 minutes in by default, long after ncclwatch's verdict: here 8x the
    # deadline (2 s, abort at 16 s). The ranks answered requests and the black boxes aged meanwhile.
    r, dumps = run_under_ncclwatch(["--abort-after-ms", "16000", "--abort-signal"], 2, 25)
    check("while the job runs" in r.stderr, f"a live verdict came first:\n{r.stderr[-3000:]}")
    check_the_ending(r, dumps, "SIGABRT", "abort long after")


@case
def framework_abort_while_ops_complete():
    # Ten collectives queued behind the stalled one (a sync every 10 iterations): the abort
    # releases them all, and they end while the process exits (its exit settles them) and after
    # the abort dump: every one of them is aborted, none completed.
    r, dumps = run_under_ncclwatch(["--abort-after-ms", "5000", "--sync-every", "10"], 2, 14)
    by_rank, aborted = check_the_ending(r, dumps, "exit status 6", "ops ending during the abort")
    for w in WAITING:
        last = by_rank[w][-1]
        seqs = sorted(op["seq"] for op in ring_entries(last) if op["state"] == "aborted")
        check(seqs == list(range(SEQ, 31)), f"rank {w}'s {os.path.basename(last['_path'])}: #{SEQ}-#30 aborted: {seqs}")


@long_case(13)
def framework_abort_just_before_the_culprit_returns():
    # Rank 3's checkpoint takes 7 s, the framework's timeout is 6 s: the others abort #21 and
    # end; rank 3 issues #21 a moment later and waits in it alone until its own framework
    # aborts. Every rank's dumps then show #21 issued, but for those who waited rank 3 never
    # came: it stays the one verdict (not stuck_in_collective).
    r, dumps = run_under_ncclwatch(["--abort-after-ms", "6000", "--abort-signal"], 3, 22, busy_ms=7000)
    by_rank, _ = check_the_ending(r, dumps, "SIGABRT", "the culprit back after the abort")
    check("abort" in [d["summary"]["reason"] for d in by_rank[BUSY]], f"rank {BUSY} aborted in the end too")
