"""CUDA graphs (issue 47): collectives captured into a graph and replayed (sim_graphs). Each
replay records the library's external start and end events again, so a hang inside a replay
is a stall like any other: named by its communicator, capture-time sequence number, replay and
call site, dumped, and analyzed. A rank that stopped replaying (busy in host code) is the
culprit with its stack; a rank whose earlier captured kernel never ends is gpu_not_reached; two
graphs replayed in different orders are a mismatch; healthy replays leave no stall."""
import json

from e2e_common import analyze, case, job
from ncclwatch_testing import check

STALL = {"NCCLWATCH_TIMEOUT": "3"}


def graphs_job(n, args, timeout=10, env=None):
    e = dict(STALL)
    e.update(env or {})
    return job(n, args, env=e, timeout=timeout, program="sim_graphs")


def stall_lines(j):
    return [l for l in j.ncclwatch_lines() if ": stall: " in l]


def first_verdict(j, cause, culprits):
    rc, report, text = analyze(j)
    summary = json.dumps(report["verdicts"], indent=1)[:3000]
    check(rc == 1 and report["verdicts"], f"a hang (exit {rc}):\n{summary}\n{text[-2000:]}")
    v = report["verdicts"][0]
    check(v["cause"] == cause, f"first verdict is {cause}:\n{summary}\n{text[-2500:]}")
    check(sorted(v["culprit_ranks"]) == sorted(culprits), f"culprits {culprits}:\n{summary}\n{text[-2500:]}")
    return v, report, text


@case
def graph_replay_waits_for_a_rank_that_stopped_replaying():
    # 4 ranks replay one captured all-reduce; rank 1 stops before replay 5 (a checkpoint write
    # that never ends); ranks 0, 2 and 3 wait inside replay 5.
    j = graphs_job(4, ["--mode", "stop", "--rank", "1", "--at", "5"])
    lines = stall_lines(j)
    check(lines, f"a stall is reported:\n{j.err[-3000:]}")
    check(all("AllReduce seq 1 (captured in a CUDA graph)" in l and "replays seen " in l for l in lines),
          f"named by its capture-time sequence number and replay:\n" + "\n".join(lines))
    stall = None
    for r in (0, 2, 3):
        if "stall" in j.reasons(r):
            stall = j.first(r, "stall")["summary"]["stalled"]
    check(stall is not None and stall["seq"] == 1 and stall["replays"] >= 1 and stall["callsite"] >= 0,
          f"the stalled record: {stall}")
    check("peer_request" in j.reasons(1), f"rank 1 dumps when asked: {j.reasons(1)}")
    v, report, text = first_verdict(j, "rank_missing", [1])
    check("write_checkpoint" in text, f"rank 1's stack shows where its host is:\n{text[-3000:]}")
    check("captured in a CUDA graph" in text, f"the report says the operation was captured:\n{text[-3000:]}")


@case
def graph_replay_earlier_captured_kernel_never_ends():
    # At replay 4, rank 2's captured kernel (before the all-reduce in the same graph) never ends.
    j = graphs_job(4, ["--mode", "kernel", "--rank", "2", "--at", "4"])
    check(stall_lines(j), f"a stall is reported:\n{j.err[-3000:]}")
    v, report, text = first_verdict(j, "gpu_not_reached", [2])


@case
def graph_replays_in_different_orders():
    # Two graphs (A: an all-reduce of 1024 floats, B: of 2048); from replay step 3 on rank 1
    # launches B before A, rank 0 A before B.
    j = graphs_job(2, ["--mode", "order", "--rank", "1", "--at", "3"])
    check(stall_lines(j), f"a stall is reported:\n{j.err[-3000:]}")
    rc, report, text = analyze(j)
    summary = json.dumps(report["verdicts"], indent=1)[:3000]
    check(rc == 1 and report["verdicts"] and report["verdicts"][0]["cause"] == "mismatch",
          f"the ranks are in different captured operations:\n{summary}\n{text[-2500:]}")
    check("1024" in text and "2048" in text, f"both calls are shown:\n{text[-2500:]}")


@case
def graph_replays_healthy():
    for mode in ("global", "thread_local", "relaxed"):
        j = graphs_job(4, ["--mode", "healthy", "--replays", "30", "--capture-mode", mode], timeout=30,
                       env={"NCCLWATCH_LOG": "info"})
        check(j.rc == 0 and j.out.count("ok") == 4, f"{mode}: the job runs as without the library (exit {j.rc}):\n"
              f"{j.err[-2000:]}")
        watching = [l for l in j.ncclwatch_lines() if "watching AllReduce seq 1, captured into a CUDA graph" in l]
        check(len(watching) == 4, f"{mode}: each rank watches its captured all-reduce at every replay "
              f"(the capture was not broken):\n{j.err[-2000:]}")
        check(not stall_lines(j), f"{mode}: no stall:\n{j.err[-2000:]}")
        for r, ds in j.dumps().items():
            reasons = [d["summary"]["reason"] for d in ds]
            check(set(reasons) <= {"exit"}, f"{mode}: rank {r} wrote only its exit record: {reasons}")
        rc, report, text = analyze(j)
        check(rc == 0 and [v["cause"] for v in report["verdicts"]] in ([], ["no_hang"]), f"{mode}: no hang:\n{text[-1500:]}")
