"""Point-to-point truth (issue 45): Send/Recv matched pair by pair on real jobs over the
simulator (sim_p2p_faults): a size mismatch inside an all-to-all group (alone, and in a group
with the step's all-reduce), a datatype mismatch
between a pipeline pair, a missing receive, two stages that both receive first in separate
groups, and a healthy all-to-all with no verdict."""
import json

from e2e_common import analyze, case, long_case, job
from ncclwatch_testing import check

STALL = {"NCCLWATCH_TIMEOUT": "3"}


def p2p_job(n, args, timeout=9):
    return job(n, args, env=STALL, timeout=timeout, program="sim_p2p_faults")


def verdict(j, cause, culprits):
    rc, report, text = analyze(j)
    v = report["verdicts"][0]
    summary = json.dumps(report["verdicts"], indent=1)[:3000]
    check(rc == 1 and v["cause"] == cause, f"first verdict is {cause} (exit {rc}):\n{summary}\n{text[-2000:]}")
    check(sorted(v["culprit_ranks"]) == sorted(culprits), f"culprits {culprits}:\n{summary}")
    check("transport" not in text, f"never the transport:\n{text}")
    check("stuck_in_collective" not in text, f"no stuck_in_collective:\n{text}")
    print(f"  {cause}: culprits {v['culprit_ranks']} seq {v['seq']} op {v['op']}")
    return v, report, text


@case
def p2p_size_mismatch_in_alltoall():
    # 8 ranks, one group of Send/Recv to every peer per step; at step 3 rank 2 sends rank 5 half
    # the elements rank 5 expects.
    j = p2p_job(8, ["--mode", "alltoall", "--steps", "6", "--fault-at", "3", "--count", "1024",
                    "--size-mismatch", "2", "5"], timeout=12)
    v, report, text = verdict(j, "p2p_mismatch", [2, 5])
    check(v["mismatch"] == "size" and v["p2p_src"] == 2 and v["p2p_dst"] == 5 and v["seq"] == 3, f"{v}")
    send, recv = v["p2p_calls"]
    check((send["rank"], send["op"], send["peer"], send["count"], send["bytes"], send["dtype"]) ==
          (2, "Send", 5, 512, 2048, "float32"), f"the send as rank 2 called it: {send}")
    check((recv["rank"], recv["op"], recv["peer"], recv["count"], recv["bytes"]) == (5, "Recv", 2, 1024, 4096),
          f"the receive as rank 5 called it: {recv}")
    check("rank 2's Send #3 to rank 5 carries 2 KiB (512 float32); rank 5's Recv #3 from rank 2 expects 4 KiB "
          "(1024 float32)" in text, text)
    # The group is one operation in text; the JSON keeps every Send and Recv of it.
    check("AlltoAll-like group #3 (7 peers)" in text, text)
    check(len(recv["group"]["ops"]) == 14 and recv["group"]["shape"] == "alltoall_like", f"{recv['group']}")
    # Both call sites: each culprit's call site is its side of the transfer.
    for r, op in ((2, "Send #3"), (5, "Recv #3")):
        s = v["culprit_stacks"][str(r)]
        check(s["callsite_op"].startswith(op), f"rank {r}'s call site is its {op}: {s['callsite_op']}")
    # Only one verdict: the others wait in the next all-reduce because of it.
    check(len(report["verdicts"]) == 1, json.dumps([x["cause"] for x in report["verdicts"]]))
    waiting = set()
    for q in v["consequences"]:
        waiting.update(q["waiting_ranks"])
    check({0, 1, 3, 4, 6, 7} <= waiting, f"the others are blocked because of it: {v['consequences']}")
    # "Also blocked" is a summary in text, every item in JSON.
    check("also blocked because of this: " + str(len(v["consequences"])) + " operations" in text, text)
    check(text.count("\n     - ") <= 4, text)


@case
def p2p_size_mismatch_in_group_with_a_collective():
    # The step's all-reduce inside the all-to-all's group (Megatron's interleaved schedule): the
    # ranks whose group completed go on to the next step's group and wait there. One verdict.
    j = p2p_job(8, ["--mode", "alltoall", "--grouped-allreduce", "--steps", "6", "--fault-at", "3",
                    "--size-mismatch", "2", "5"], timeout=12)
    v, report, text = verdict(j, "p2p_mismatch", [2, 5])
    check(len(report["verdicts"]) == 1, json.dumps([x["cause"] for x in report["verdicts"]]))
    send, recv = v["p2p_calls"]
    check(send["group"]["shape"] == "mixed" and len(send["group"]["ops"]) == 15, f"{send['group']}")
    check("AllReduce" in [o["op"] for o in recv["group"]["ops"]], f"{recv['group']}")
    waiting = set()
    for q in v["consequences"]:
        waiting.update(q["waiting_ranks"])
    check({0, 1, 3, 4, 6, 7} <= waiting, f"the others are blocked because of it: {v['consequences']}")


@case
def p2p_dtype_mismatch_in_pipeline():
    # A 4-stage pipeline: at step 3 stage 1 sends bfloat16 where stage 2 expects float32.
    j = p2p_job(4, ["--mode", "pipeline", "--steps", "6", "--fault-at", "3", "--dtype-mismatch", "1", "2"])
    v, report, text = verdict(j, "p2p_mismatch", [1, 2])
    check(v["mismatch"] == "datatype", f"{v}")
    send, recv = v["p2p_calls"]
    check((send["dtype"], send["bytes"], recv["dtype"], recv["bytes"]) == ("bfloat16", 2048, "float32", 4096),
          f"{send} {recv}")
    check("datatype mismatch" in text and "rank 1's Send #3 to rank 2 carries 2 KiB (1024 bfloat16); rank 2's "
          "Recv #3 from rank 1 expects 4 KiB (1024 float32)" in text, text)


@long_case(13)
def p2p_missing_recv():
    # In the all-to-all of step 3, rank 5 posts no receive from rank 2.
    j = p2p_job(8, ["--mode", "alltoall", "--steps", "6", "--fault-at", "3", "--missing-recv", "2", "5"], timeout=12)
    v, report, text = verdict(j, "p2p_unmatched", [5])
    check(v["p2p_src"] == 2 and v["p2p_dst"] == 5 and v["seq"] == 3 and v["op"] == "Send", f"{v}")
    check("rank 5 never posted the Recv matching rank 2's Send #3" in text, text)
    check("Send/Recv deadlock" not in text, f"a missing receive, not a deadlock:\n{text}")


@case
def p2p_both_receive_first():
    # Pairs (0,1) and (2,3) exchange in one group each step; at step 3 every rank posts its
    # receive in a group of its own, then its send in a second group.
    j = p2p_job(4, ["--mode", "exchange", "--steps", "6", "--fault-at", "3", "--recv-first"])
    rc, report, text = analyze(j)
    summary = json.dumps(report["verdicts"], indent=1)[:3000]
    causes = [x["cause"] for x in report["verdicts"]]
    check(rc == 1 and causes == ["p2p_out_of_order", "p2p_out_of_order"], f"both pairs named:\n{summary}\n{text}")
    check(sorted(sorted(x["culprit_ranks"]) for x in report["verdicts"]) == [[0, 1], [2, 3]], summary)
    for v in report["verdicts"]:
        check(len(v["cycle"]) == 3 and v["seq"] == 3 and v["p2p_src"] is not None, f"the wait cycle is shown: {v}")
    check("Send/Recv out of order between ranks 0, 1" in text and "transport" not in text, text)


@case
def p2p_healthy_alltoall():
    j = p2p_job(8, ["--mode", "alltoall", "--steps", "20"], timeout=20)
    check(j.rc == 0 and j.out.count("ok") == 8, f"the job finished: {j.rc}\n{j.err[-1500:]}")
    rc, report, text = analyze(j)
    check(rc == 0 and [x["cause"] for x in report["verdicts"]] == ["no_hang"], f"no verdict:\n{text}")
    check("mismatch" not in text and "unmatched" not in text, text)
