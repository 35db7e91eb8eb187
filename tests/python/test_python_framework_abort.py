#!/usr/bin/env python3
"""A Python job with a framework-like watchdog thread (sim_job.py, WATCHDOG_S): rank 0 "saves a
checkpoint" at step 5 while ranks 1-3 wait in the all-reduce; ncclwatch's deadline (2 s) names
rank 0; then each waiting rank's watchdog (5 s) aborts its communicator and ends the process:
abort() (SIGABRT, as PyTorch does) or exit status 6. The report keeps rank 0 as the one verdict
and tells ranks 1-3 as ended by their framework after the wait: never rank_dead, never culprits;
the operations the abort released are aborted, never completed or recovered.
    test_python_framework_abort.py BUILD_DIR
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import Checks, all_of, dumped  # noqa: E402
from python_jobs import run_sim_job  # noqa: E402

build = os.path.abspath(sys.argv[1])
check = Checks(verbose=True)

for ending, how in (("abort", "SIGABRT"), ("exit", "exit status 6")):
    # Ended once ranks 1-3 have ended (their last dump: the SIGABRT's or the exit record) and
    # rank 0 has answered the request their aborts wrote.
    p, dumps, boxes = run_sim_job(build, 4, 25, BUSY_RANK="0", BUSY_STEP="5", WATCHDOG_S="5",
                                  WATCHDOG_ENDING=ending, NCCL_API="cdll",
                                  until=lambda d: all_of(dumped(d, [1, 2, 3], ["fatal_signal", "exit"]),
                                                         dumped(d, [0], ["peer_request"])))
    reasons = {}
    for f in sorted(glob.glob(os.path.join(dumps, "rank*.json"))):
        d = json.load(open(f))
        reasons.setdefault(d["summary"]["rank"], []).append((d["summary"]["dump_seq"], d["summary"]["reason"]))
        for c in d["summary"]["comms"]:
            check(c["last_completed"] < 6, f"{ending}: {os.path.basename(f)}: last_completed {c['last_completed']} "
                                           f"(#6 never completed)")
    reasons = {r: [x for _, x in sorted(v)] for r, v in reasons.items()}
    for r in (1, 2, 3):
        check("abort" in reasons.get(r, []), f"{ending}: rank {r}'s watchdog aborted ({reasons.get(r)})\n{p.stderr[-2000:]}")
    check(not any("recovery" in v for v in reasons.values()), f"{ending}: no recovery dump: {reasons}")
    runs = {}
    for fmt in ("--json", "--no-color"):
        runs[fmt] = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "analyze", fmt, dumps],
                                   capture_output=True, text=True, env=dict(os.environ, NCCLWATCH_BLACKBOX_DIR=boxes))
    try:
        report = json.loads(runs["--json"].stdout)
    except ValueError:
        report = {"verdicts": []}
    text = runs["--no-color"].stdout
    verdicts = [(v["cause"], v["culprit_ranks"]) for v in report["verdicts"]]
    check(runs["--json"].returncode == 1 and verdicts == [("rank_missing", [0])],
          f"{ending}: rank 0 missing, the only verdict: {verdicts}\n{text[-3000:]}")
    v = report["verdicts"][0] if report["verdicts"] else {}
    check(v.get("seq") == 6 and v.get("waiting_ranks") == [1, 2, 3], f"{ending}: #6, ranks 1-3 waiting: {v.get('seq')} "
                                                                      f"{v.get('waiting_ranks')}")
    ended = v.get("ended_by_framework", [])
    check(sorted(e["rank"] for e in ended) == [1, 2, 3] and all(how in e["how"] for e in ended),
          f"{ending}: ranks 1-3 ended by their framework ({how}): {ended}")
    check("rank_dead" not in text and "ended by their framework after the wait" in text and how in text,
          f"{ending}: the text tells it:\n{text[-3000:]}")
    stacks = v.get("culprit_stacks", {}).get("0", {})
    check("save_checkpoint" in json.dumps(stacks), f"{ending}: rank 0's stack shows the checkpoint: {str(stacks)[:1500]}")

sys.exit(check.finish())
