#!/usr/bin/env python3
"""A Python rank (sim_job.py over the simulator, ctypes, libncclwatch.so preloaded) that ends or
stops in its first moments, its NCCL calls made with the GIL held (PyDLL) or released (CDLL, as
PyTorch does):
  - SIGKILLed right after its 1st or its 20th all-reduce: its postmortem keeps its Python call
    site (train_step, the call's line), not only ctypes' and libffi's native frames;
  - SIGKILLed or SIGSTOPped right after its 20th: the report names its last call #20, never #1 or
    "never polled", and the stopped one is stopped, not "SIGKILL or the OOM killer".
    test_python_early_end.py BUILD_DIR
"""
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import Checks, dumped  # noqa: E402
from python_jobs import analyze_json, marker_line, run_sim_job  # noqa: E402

build = os.path.abspath(sys.argv[1])
call_line = marker_line("CALL-LINE")
check = Checks(verbose=True)
WRONG = re.compile(r"#1\b(?!\d)|never polled|finished #1 ")


def python_top(frames):
    py = [f for f in frames if f.get("kind") == "python"]
    return py[0] if py else {}


for api in ("pydll", "cdll"):
    for steps, how in ((1, "KILL"), (20, "KILL"), (20, "STOP")):
        what = f"{api}, {'SIGSTOP' if how == 'STOP' else 'SIGKILL'} after step {steps}"
        # On a loaded machine the watchdog thread may not have run at all in the milliseconds the
        # rank lived, or the simulated GPU may still be at #1 when it last did: such a box (it
        # says so; never a wrong text) is tried again, up to six times (three were not always
        # enough beside two busy loops, a sanitizer build and five other end-to-end tests). A
        # stopped rank's is read from its stand-in when the job ended before its post-mortem.
        def settled(d):
            done = max((c.get("last_completed", 0) for c in d["summary"].get("comms", [])), default=0)
            return d["summary"].get("states_as_of_mono_ns", 0) > 0 and (steps == 1 or done > 1)
        for attempt in range(6):
            # Ended once rank 0 has dumped its stall (as its time limit would end it).
            p, dumps, boxes = run_sim_job(build, 2, 8, BUSY_RANK="-1", NCCL_API=api, DIE_RANK="1",
                                          until=lambda d: dumped(d, [0]),
                                          DIE_STEP=str(steps), DIE_NOW="1", DIE_SIGNAL=how)
            # Read from its black box: a post-mortem, or the stand-in of a stopped process.
            boxed = [json.load(open(f)) for f in glob.glob(os.path.join(dumps, "rank00001-*.json"))
                     if f.endswith(("-postmortem.json", "-stopped.json"))]
            if all(settled(d) for d in boxed):
                break
        report = analyze_json(build, dumps, boxes)
        v = report["verdicts"][0] if report["verdicts"] else {}
        cause = "rank_stopped" if how == "STOP" else "rank_dead"
        check(v.get("cause") == cause and v.get("culprit_ranks") == [1],
              f"{what}: {cause} [1] ({v.get('cause')} {v.get('culprit_ranks')}); launcher:\n{p.stderr[-1500:]}")
        s = v.get("culprit_stacks", {}).get("1", {})
        top = python_top(s.get("callsite", []))
        check(top.get("function") == "train_step" and top.get("file", "").endswith("sim_job.py") and
              top.get("line") == call_line, f"{what}: its call site's Python line, train_step at sim_job.py:{call_line} "
                                             f"({top}; {[f.get('function') for f in s.get('callsite', [])][:6]})")
        where = s.get("where", "")
        check(f"#{steps}" in where and not (steps > 1 and WRONG.search(where)),
              f"{what}: its last call #{steps}, nothing false ({where})")
        if how == "STOP":
            check("stopped (SIGSTOP" in where and "OOM" not in where, f"{what}: seen stopped ({where})")
        for f in glob.glob(os.path.join(dumps, "rank00001-*-postmortem.json")):
            d = json.load(open(f))
            check(d["summary"].get("states_as_of_mono_ns", 0) > 0, f"{what}: its box has op states ({f})")
sys.exit(check.finish())
