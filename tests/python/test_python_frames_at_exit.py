#!/usr/bin/env python3
"""A native thread's call site whose Python frames could not be named when it was first seen
(another thread kept the GIL in C code then) is still named in what the rank leaves at its end:
its exit record is written after the interpreter is gone, when no frame can be named any more.
Rank 1's all-reduces come from a C thread driven by train_step; a thread holds the GIL for 2 s
from the moment its first step releases it; rank 1 then leaves the loop at step 8 and exits 0,
and rank 0 waits for it. The report names rank 1's line ("during `train_step` at sim_job.py:N,
driven from the main thread"), never "? (:0)" or "during `` at :0".
    test_python_frames_at_exit.py BUILD_DIR
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ncclwatch_testing import Checks, all_of, dumped  # noqa: E402
from python_jobs import SCRIPT as script, marker_line, run_sim_job  # noqa: E402

build = os.path.abspath(sys.argv[1])
driver_line = marker_line("DRIVER-LINE")
check = Checks(verbose=True)

p, dumps, boxes = run_sim_job(build, 2, 40, NATIVE_ISSUER=os.path.join(build, "lib", "libsim_native_issuer.so"),
                              GIL_HOG_RANK="1", GIL_HOG_S="2", EXIT_RANK="1", EXIT_STEP="8", BUSY_RANK="-1",
                              until=lambda d: all_of(dumped(d, [1], ["exit"]), dumped(d, [0], ["stall"])))
exits = sorted(glob.glob(os.path.join(dumps, "rank00001-*-exit.json")))
check(exits, f"rank 1 wrote its exit record ({os.listdir(dumps) if os.path.isdir(dumps) else 'no dumps'}); "
             f"launcher:\n{p.stderr[-2000:]}")
for f in exits[-1:]:
    d = json.load(open(f))
    sites = [c for c in d.get("callsites", []) if c.get("python_driven_from")]
    py = sites[0].get("python", []) if sites else []
    check(py and py[0].get("function") == "train_step" and py[0].get("line") == driver_line and py[0].get("file") == script,
          f"the exit record's call site names the driving line sim_job.py:{driver_line} ({py[:1]}, "
          f"{[c.get('note') for c in sites]})")

env = dict(os.environ, NCCLWATCH_BLACKBOX_DIR=boxes)
a = subprocess.run([os.path.join(build, "bin", "ncclwatch"), "analyze", "--no-color", dumps], capture_output=True,
                   text=True, env=env)
want = f"during `train_step` at sim_job.py:{driver_line}, driven from the main thread"
check(want in a.stdout, f"the report names rank 1's Python line ({want}):\n{a.stdout[-3000:]}")
check("? (:0)" not in a.stdout and "during ``" not in a.stdout and " at :0" not in a.stdout,
      f"no unnamed frame printed as a name:\n{a.stdout[-3000:]}")
sys.exit(check.finish())
