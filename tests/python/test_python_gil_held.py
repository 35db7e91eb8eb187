#!/usr/bin/env python3
"""A rank that holds the GIL when the job's teardown dumps it (sim_job.py over the simulator,
ctypes, libncclwatch.so preloaded): rank 1 stops at step 5, first waiting without the GIL (its
answer to the others' stall request has its Python frames), then keeping the GIL: inside C code
(HOLD_HOW=c), or spinning in pure Python that gives no other thread the GIL (HOLD_HOW=spin).
- Its SIGTERM dump still has its Python frames, read without the GIL from the interpreter's
  thread states, at the line it is on, with a note saying how they were read.
- Analysis: where a later dump has no Python frames for that thread (a CPython whose layout
  ncclwatch does not know: emulated by taking them out of the SIGTERM dump), nothing happened in
  between, so `ncclwatch analyze` shows the earlier dump's Python stack, saying so.
    test_python_gil_held.py BUILD_DIR
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import Checks  # noqa: E402
from python_jobs import SCRIPT as script, marker_line, run_sim_job  # noqa: E402

build = os.path.abspath(sys.argv[1])


free_line, held_line, spin_line = marker_line("GIL-FREE-LINE"), marker_line("GIL-HELD-LINE"), marker_line("GIL-SPIN-LINE")
check = Checks(verbose=True)


def run(how):
    p, dumps, boxes = run_sim_job(build, 2, 10, BUSY_RANK="-1", NCCLWATCH_GIL_TIMEOUT_MS="300", HOLD_RANK="1",
                                  HOLD_STEP="5", HOLD_HOW=how, NCCL_API="cdll")
    by_reason = {}
    for f in sorted(glob.glob(os.path.join(dumps, "rank00001-*.json"))):
        by_reason[json.load(open(f))["summary"]["reason"]] = f
    return dumps, by_reason, p


def main_thread(d):
    return next((t for t in d["threads"] if t["tid"] == d["summary"]["pid"]), {})


def main_python(d):
    t = main_thread(d)
    return t["python"] if "python" in t else t.get("stack", {}).get("python", [])


def analyze(dumps):
    a = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "analyze", "--json", dumps], capture_output=True,
                       text=True)
    report = json.loads(a.stdout) if a.stdout.startswith("{") else {"verdicts": [{}]}
    v = report["verdicts"][0]
    check(v.get("cause") == "rank_missing" and v.get("culprit_ranks") == [1],
          f"rank 1 is busy ({v.get('cause')} {v.get('culprit_ranks')})")
    s = v.get("culprit_stacks", {}).get("1", {})
    return [f for f in s.get("current", []) if f.get("kind") == "python"], s.get("note", "")


for how, function, lines in (("c", "hold_the_gil", (held_line,)),
                             ("spin", "spin_in_python", (spin_line - 1, spin_line))):
    dumps, by_reason, p = run(how)
    ok = "peer_request" in by_reason and "signal" in by_reason
    check(ok, f"{how}: rank 1 answered the stall request and the SIGTERM ({sorted(by_reason)}); launcher:\n"
              f"{p.stderr[-2000:]}")
    if not ok:
        continue
    first = [f for f in main_python(json.load(open(by_reason["peer_request"]))) if f.get("function") == "hold_the_gil"]
    check(first and first[0]["line"] == free_line, f"{how}: its first dump has hold_the_gil at sim_job.py:{free_line} ({first})")
    signal_dump = json.load(open(by_reason["signal"]))
    last = main_python(signal_dump)
    check(last and last[0].get("function") == function and last[0].get("line") in lines and
          last[0].get("file") == script,
          f"{how}: its SIGTERM dump has the main thread's Python frames, innermost {function} at sim_job.py:{lines} ({last[:2]})")
    check(any(f.get("function") == "main" for f in last), f"{how}: ... down to main ({[f.get('function') for f in last]})")
    check("without the GIL" in main_thread(signal_dump).get("note", ""),
          f"{how}: and a note says they were read without the GIL ({main_thread(signal_dump).get('note')})")
    py, note = analyze(dumps)
    check(py and py[0]["function"] == function and py[0]["line"] in lines,
          f"{how}: the verdict's current stack is the SIGTERM dump's Python one ({py[:2]})")
    if how != "c":
        continue
    # A dump without them (a CPython whose frame layout is unknown): the earlier dump's stack.
    t = main_thread(signal_dump)
    t.pop("python", None)
    t.get("stack", {}).pop("python", None)
    json.dump(signal_dump, open(by_reason["signal"], "w"))
    py, note = analyze(dumps)
    check(py and py[0]["function"] == "hold_the_gil" and py[0]["line"] == free_line,
          f"without them, its current stack is the earlier dump's Python one ({py[:2]})")
    check("earlier dump" in note and "-peer_request.json" in note, f"and the report says where it comes from ({note})")
sys.exit(check.finish())
