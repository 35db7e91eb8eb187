#!/usr/bin/env python3
"""A real python3 job (sim_job.py, 2 ranks, simulated NCCL through ctypes, libncclwatch.so
preloaded): the dumps show the script's own file and lines, Python frames first.
    test_python_traces.py BUILD_DIR
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

build = os.path.abspath(sys.argv[1])
here = os.path.dirname(os.path.abspath(__file__))
script = os.path.join(here, "sim_job.py")
lines = {tag: i for i, l in enumerate(open(script), 1) for tag in ("BUSY-LINE", "CALL-LINE") if tag in l}
tmp = tempfile.mkdtemp(prefix="ncclwatch-py-")
env = dict(os.environ, LD_PRELOAD=os.path.join(build, "lib", "libncclwatch.so"), NCCLWATCH_DIR=tmp,
           NCCLWATCH_TIMEOUT="3", NCCLWATCH_PEER_POLL_MS="200", BUSY_RANK="1", BUSY_STEP="5")
p = subprocess.run([os.path.join(build, "bin", "simlaunch"), "-n", "2", "--timeout", "10", "--",
                    sys.executable, script], env=env, capture_output=True, text=True)
failures, passes = [], []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    (passes if cond else failures).append(what)


dumps = {}
for f in sorted(glob.glob(os.path.join(tmp, "rank*.json"))):
    d = json.load(open(f))
    dumps.setdefault(d["summary"]["rank"], []).append(d)
check(sorted(dumps) == [0, 1], f"both ranks dumped ({sorted(dumps)}); launcher said:\n{p.stderr[-2000:]}")
if sorted(dumps) == [0, 1]:
    stall = next((d for d in dumps[0] if d["summary"]["reason"] == "stall"), None)
    check(stall is not None, "rank 0 reported the stall")
    if stall:
        site = stall["summary"]["stalled"]["callsite"]
        cs = next((c for c in stall["callsites"] if c["id"] == site), None)
        py = cs["python"] if cs else []
        check(bool(py) and py[0]["file"].endswith("sim_job.py") and py[0]["line"] == lines["CALL-LINE"]
              and py[0]["function"] == "train_step",
              f"the stalled all-reduce's call site is sim_job.py:{lines['CALL-LINE']} in train_step ({py[:2]})")
        check(len(py) > 1 and py[1]["function"] == "main", "and the frame below it is main()")
    busy = dumps[1][0]
    frames = [f for t in busy["threads"] for f in t["python"]]
    top = next((f for f in frames if f["file"].endswith("sim_job.py")), None)
    check(top is not None and top["line"] == lines["BUSY-LINE"] and top["function"] == "save_checkpoint",
          f"the busy rank's Python stack is at sim_job.py:{lines['BUSY-LINE']} in save_checkpoint ({top})")
    check(busy["summary"]["in_nccl"] == [], "and it is not inside NCCL")
print(f"{len(passes)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
