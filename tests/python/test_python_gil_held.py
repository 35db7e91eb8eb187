#!/usr/bin/env python3
"""A rank that holds the GIL when the job's teardown dumps it (sim_job.py over the simulator,
ctypes, libncclwatch.so preloaded): rank 1 stops at step 5, first waiting without the GIL (its
answer to the others' stall request has its Python frames), then inside C code that keeps the
GIL (its SIGTERM dump cannot name its Python frames). Nothing happened in between, so
`ncclwatch analyze` shows the earlier dump's Python stack, saying so, never the later native-only
one.
    test_python_gil_held.py BUILD_DIR
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import Checks, temp_dir  # noqa: E402

build = os.path.abspath(sys.argv[1])
here = os.path.dirname(os.path.abspath(__file__))
script = os.path.join(here, "sim_job.py")
free_line = next(i for i, l in enumerate(open(script), 1) if "GIL-FREE-LINE" in l)
check = Checks(verbose=True)

tmp = temp_dir("ncclwatch-py-")
boxes = os.path.join(tmp, "boxes")
os.makedirs(boxes)
dumps = os.path.join(tmp, "dumps")
env = dict(os.environ, LD_PRELOAD=os.path.join(build, "lib", "libncclwatch.so"), NCCLWATCH_DIR=dumps,
           NCCLWATCH_TIMEOUT="2", NCCLWATCH_PEER_POLL_MS="200", NCCLWATCH_BLACKBOX_DIR=boxes, BUSY_RANK="-1",
           NCCLWATCH_GIL_TIMEOUT_MS="300", HOLD_RANK="1", HOLD_STEP="5", NCCL_API="cdll")
p = subprocess.run([os.path.join(build, "bin", "simlaunch"), "-n", "2", "--timeout", "10", "--", sys.executable, script],
                   env=env, capture_output=True, text=True, timeout=90)
by_reason = {}
for f in sorted(glob.glob(os.path.join(dumps, "rank00001-*.json"))):
    d = json.load(open(f))
    by_reason[d["summary"]["reason"]] = d


def main_python(d):
    return next((t["python"] if "python" in t else t.get("stack", {}).get("python", [])
                 for t in d["threads"] if t["tid"] == d["summary"]["pid"]), [])


check("peer_request" in by_reason and "signal" in by_reason,
      f"rank 1 answered the stall request and the SIGTERM ({sorted(by_reason)}); launcher:\n{p.stderr[-2000:]}")
if "peer_request" in by_reason and "signal" in by_reason:
    first = [f for f in main_python(by_reason["peer_request"]) if f.get("function") == "hold_the_gil"]
    check(first and first[0]["line"] == free_line, f"its first dump has hold_the_gil at sim_job.py:{free_line} ({first})")
    check(not main_python(by_reason["signal"]), "its SIGTERM dump has no Python frames of the main thread (the GIL is held)")
a = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "analyze", "--json", dumps], capture_output=True, text=True)
report = json.loads(a.stdout) if a.stdout.startswith("{") else {"verdicts": [{}]}
v = report["verdicts"][0]
check(v.get("cause") == "rank_missing" and v.get("culprit_ranks") == [1], f"rank 1 is busy ({v.get('cause')} {v.get('culprit_ranks')})")
s = v.get("culprit_stacks", {}).get("1", {})
py = [f for f in s.get("current", []) if f.get("kind") == "python"]
check(py and py[0]["function"] == "hold_the_gil" and py[0]["line"] == free_line,
      f"its current stack is the earlier dump's Python one ({py[:2]})")
check("earlier dump" in s.get("note", "") and "-peer_request.json" in s.get("note", ""),
      f"and the report says where it comes from ({s.get('note')})")
sys.exit(check.finish())
